// streamalloc._torch_ext: the few calls the Python package needs from the LibTorch plugin. A plain
// CPython module (no pybind11), so it adds nothing to the build beyond the Python headers.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

#include <c10/util/Exception.h>

#include "streamalloc/torch.hpp"
#include "streamalloc/types.hpp"

namespace {

using streamalloc::Allocator;

// Runs `body`, turning C++ exceptions into Python ones: option errors become ValueError (they name
// the key and the accepted values), everything else RuntimeError.
template <typename F>
PyObject* guarded(F&& body) {
  try {
    return body();
  } catch (const streamalloc::Error& error) {
    PyErr_SetString(error.code() == streamalloc::ErrorCode::kConfig ? PyExc_ValueError : PyExc_RuntimeError,
                    error.what());
  } catch (const c10::Error& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what_without_backtrace());
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
  return nullptr;
}

PyObject* to_str(const std::string& text) { return PyUnicode_FromStringAndSize(text.data(), text.size()); }

// The running allocator; RuntimeError when PyTorch has not initialised CUDA yet.
Allocator& running() {
  Allocator* allocator = streamalloc::torch::allocator();
  if (allocator == nullptr) {
    throw std::runtime_error(
        "streamalloc: the allocator does not exist yet; PyTorch creates it when it "
        "initialises CUDA (at the first CUDA operation)");
  }
  return *allocator;
}

// The same answers as the C ABI's streamalloc_resolve_conf() and streamalloc_zero_stats_json(), so the
// package reads either path the same way (streamalloc/_native.py, ABI).
PyObject* resolve_conf(PyObject*, PyObject* args) {
  const char* base = nullptr;
  const char* conf = nullptr;
  const char* source = nullptr;
  if (!PyArg_ParseTuple(args, "sss", &base, &conf, &source)) return nullptr;
  return guarded([&] { return to_str(streamalloc::Options::resolve(base, conf, source).to_json()); });
}

PyObject* zero_stats_json(PyObject*, PyObject*) {
  return guarded([&] { return to_str(streamalloc::DeviceStats{}.to_json()); });
}

PyObject* install(PyObject*, PyObject* args) {
  const char* conf = nullptr;
  if (!PyArg_ParseTuple(args, "s", &conf)) return nullptr;
  const std::string text(conf);
  return guarded([&]() -> PyObject* {
    const streamalloc::Options options = streamalloc::Options::parse(text);  // ValueError when bad
    try {
      streamalloc::torch::install(options);
    } catch (const streamalloc::Error& error) {
      // The options parsed; what failed is the installation itself (too late, installed before).
      throw std::runtime_error(error.what());
    }
    Py_RETURN_NONE;
  });
}

PyObject* is_initialized(PyObject*, PyObject*) { return PyBool_FromLong(streamalloc::torch::allocator() != nullptr); }

PyObject* stats_json(PyObject*, PyObject* args) {
  int device = 0;
  if (!PyArg_ParseTuple(args, "i", &device)) return nullptr;
  return guarded([&] { return to_str(running().stats_json(device)); });
}

PyObject* snapshot_json(PyObject*, PyObject*) {
  return guarded([&] { return to_str(running().snapshot_json()); });
}

PyObject* pending_history_json(PyObject*, PyObject* args) {
  int device = 0;
  if (!PyArg_ParseTuple(args, "i", &device)) return nullptr;
  return guarded([&] { return to_str(running().pending_history_json(device)); });
}

PyObject* reset_peak_stats(PyObject*, PyObject* args) {
  int device = 0;
  if (!PyArg_ParseTuple(args, "i", &device)) return nullptr;
  return guarded([&]() -> PyObject* {
    running().reset_peak_stats(device);
    Py_RETURN_NONE;
  });
}

PyObject* validate(PyObject*, PyObject*) {
  return guarded([&]() -> PyObject* {
    running().validate();
    Py_RETURN_NONE;
  });
}

// check_sync: PyTorch's GPU trace callbacks (streamalloc/_sync_trace.py) report the synchronization
// streamalloc does not make itself. Before PyTorch created the allocator there is nothing to check.
PyObject* note_event_record(PyObject*, PyObject* args) {
  unsigned long long event = 0, stream = 0;
  if (!PyArg_ParseTuple(args, "KK", &event, &stream)) return nullptr;
  if (streamalloc::Allocator* allocator = streamalloc::torch::allocator()) {
    allocator->note_event_record(static_cast<std::uintptr_t>(event), static_cast<streamalloc::Stream>(stream));
  }
  Py_RETURN_NONE;
}

PyObject* note_event_wait(PyObject*, PyObject* args) {
  unsigned long long event = 0, stream = 0;
  if (!PyArg_ParseTuple(args, "KK", &event, &stream)) return nullptr;
  if (streamalloc::Allocator* allocator = streamalloc::torch::allocator()) {
    allocator->note_event_wait(static_cast<std::uintptr_t>(event), static_cast<streamalloc::Stream>(stream));
  }
  Py_RETURN_NONE;
}

PyObject* note_stream_synchronize(PyObject*, PyObject* args) {
  unsigned long long stream = 0;
  if (!PyArg_ParseTuple(args, "K", &stream)) return nullptr;
  if (streamalloc::Allocator* allocator = streamalloc::torch::allocator()) {
    allocator->note_stream_synchronize(static_cast<streamalloc::Stream>(stream));
  }
  Py_RETURN_NONE;
}

PyObject* note_device_synchronize(PyObject*, PyObject*) {
  if (streamalloc::Allocator* allocator = streamalloc::torch::allocator()) allocator->note_device_synchronize();
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"resolve_conf", resolve_conf, METH_VARARGS,
     "resolve_conf(base, conf, source) -> JSON {conf, options} of conf's options on top of base's; "
     "ValueError for a bad key or value"},
    {"zero_stats_json", zero_stats_json, METH_NOARGS, "zero_stats_json() -> stats_json's keys, every number 0"},
    {"install", install, METH_VARARGS, "install(conf): make streamalloc PyTorch's CUDA allocator"},
    {"is_initialized", is_initialized, METH_NOARGS, "True once PyTorch's CUDA init created the allocator"},
    {"stats_json", stats_json, METH_VARARGS, "stats_json(device) -> DeviceStats as JSON"},
    {"snapshot_json", snapshot_json, METH_NOARGS, "snapshot_json() -> every device's segments as JSON"},
    {"pending_history_json", pending_history_json, METH_VARARGS,
     "pending_history_json(device) -> the last changes of pending bytes per stream as JSON (pending_history:N)"},
    {"reset_peak_stats", reset_peak_stats, METH_VARARGS, "reset_peak_stats(device)"},
    {"validate", validate, METH_NOARGS, "validate(): check every invariant; RuntimeError naming a broken one"},
    {"note_event_record", note_event_record, METH_VARARGS, "note_event_record(event, stream), for check_sync"},
    {"note_event_wait", note_event_wait, METH_VARARGS, "note_event_wait(event, stream), for check_sync"},
    {"note_stream_synchronize", note_stream_synchronize, METH_VARARGS, "note_stream_synchronize(stream)"},
    {"note_device_synchronize", note_device_synchronize, METH_NOARGS, "note_device_synchronize()"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT,
    "_torch_ext",
    "streamalloc's LibTorch allocator (see streamalloc/_enable.py)",
    -1,
    kMethods,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__torch_ext() { return PyModule_Create(&kModule); }
