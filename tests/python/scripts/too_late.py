"""enable() after CUDA is initialised: a clear error from the package, and from the extension itself."""

import streamalloc
import torch
from _common import emit


def main() -> None:
    torch.zeros(1, device="cuda")  # initialises CUDA with PyTorch's own allocator
    result = {}
    try:
        streamalloc.enable()
    except RuntimeError as error:
        result["enable"] = str(error)
    from streamalloc import _native

    path = _native.find_extension()
    if path is not None:
        try:
            _native.load_extension(path).install("")
        except RuntimeError as error:
            result["extension"] = str(error)
    result["enabled"] = streamalloc.is_enabled()
    result["still_works"] = float(torch.ones(4, device="cuda").sum())
    emit(result)


if __name__ == "__main__":
    main()
