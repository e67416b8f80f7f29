# streamalloc_find_torch(): find LibTorch's CMake package, once for every part of the build that needs it
# (torch_plugin/ and the torch_native benchmark peer in bench/).
#
# With Torch_DIR or a CMAKE_PREFIX_PATH that holds TorchConfig.cmake, find_package(Torch) finds it as
# usual. Without them, the Python interpreter CMake finds (Python3_EXECUTABLE selects it; else python3 on
# PATH) is asked where its torch keeps that package (torch.utils.cmake_prefix_path), so a pip-installed
# torch needs no flag.
# A macro, so that Torch_FOUND, TORCH_LIBRARIES and the imported targets are the caller's.
macro(streamalloc_find_torch)
  if(NOT Torch_DIR)
    # Only when no caller found Python yet: a second find_package(Python3) with fewer components would
    # unset what the first found (the extension module's Development.Module).
    if(NOT Python3_Interpreter_FOUND)
      find_package(Python3 COMPONENTS Interpreter QUIET)
    endif()
    if(Python3_Interpreter_FOUND)
      set(STREAMALLOC_TORCH_PYTHON "${Python3_EXECUTABLE}")
    else()
      # FindPython3 misses an interpreter that a wrapper script puts on PATH (pyenv's shims): ask PATH.
      find_program(STREAMALLOC_TORCH_PYTHON NAMES python3 python)
    endif()
    if(STREAMALLOC_TORCH_PYTHON)
      execute_process(
        COMMAND "${STREAMALLOC_TORCH_PYTHON}" -c "import torch, sys; sys.stdout.write(torch.utils.cmake_prefix_path)"
        OUTPUT_VARIABLE _streamalloc_torch_prefix RESULT_VARIABLE _streamalloc_torch_rc ERROR_QUIET)
      if(_streamalloc_torch_rc EQUAL 0 AND NOT "${_streamalloc_torch_prefix}" IN_LIST CMAKE_PREFIX_PATH)
        list(APPEND CMAKE_PREFIX_PATH "${_streamalloc_torch_prefix}")
      endif()
    endif()
  endif()
  find_package(Torch QUIET)
endmacro()
