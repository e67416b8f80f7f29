# RMM (the RAPIDS Memory Manager) for the rmm_* benchmark peers, from the prefix bench/peers/fetch_rmm.sh
# unpacks its wheels into. Defines, when found:
#   streamalloc_rmm   imported target: RMM's headers (and the CCCL 3.5 headers it is built against),
#                     librmm.so and librapids_logger.so, linked by full path (so CMake puts their folder
#                     on the RPATH of every program that links them)
# and sets STREAMALLOC_BENCH_RMM to ON or OFF with the reason in STREAMALLOC_BENCH_RMM_REASON.
#
# RMM's own CMake package is not used: it links the static CUDA runtime into its users, and this build
# links the shared one (streamalloc's CUDA backend, LibTorch). librmm.so carries its own static runtime;
# stream and event handles are the driver's, so both runtimes see the same ones.
set(STREAMALLOC_RMM_ROOT "${PROJECT_SOURCE_DIR}/third_party/rmm" CACHE PATH
    "RMM install prefix for the rmm_* benchmark peers (bench/peers/fetch_rmm.sh fills the default)")

set(STREAMALLOC_BENCH_RMM OFF)
set(STREAMALLOC_BENCH_RMM_REASON "")
if(NOT STREAMALLOC_HAVE_CUDA)
  set(STREAMALLOC_BENCH_RMM_REASON "the CUDA backend is not built")
elseif(NOT EXISTS "${STREAMALLOC_RMM_ROOT}/include/rmm/mr/arena_memory_resource.hpp")
  set(STREAMALLOC_BENCH_RMM_REASON "no RMM in ${STREAMALLOC_RMM_ROOT}; bench/peers/fetch_rmm.sh fetches it")
else()
  # Plain paths, not find_library(): a cached result would outlive a change of STREAMALLOC_RMM_ROOT.
  set(STREAMALLOC_RMM_LIBRARY "")
  set(STREAMALLOC_RAPIDS_LOGGER_LIBRARY "")
  foreach(_rmm_libdir lib64 lib)
    if(NOT STREAMALLOC_RMM_LIBRARY AND EXISTS "${STREAMALLOC_RMM_ROOT}/${_rmm_libdir}/librmm.so")
      set(STREAMALLOC_RMM_LIBRARY "${STREAMALLOC_RMM_ROOT}/${_rmm_libdir}/librmm.so")
    endif()
    if(NOT STREAMALLOC_RAPIDS_LOGGER_LIBRARY AND EXISTS "${STREAMALLOC_RMM_ROOT}/${_rmm_libdir}/librapids_logger.so")
      set(STREAMALLOC_RAPIDS_LOGGER_LIBRARY "${STREAMALLOC_RMM_ROOT}/${_rmm_libdir}/librapids_logger.so")
    endif()
  endforeach()
  # RMM 26.10 needs CCCL 3.5 (cuda::mr::shared_resource, any_resource); CUDA 13.0 ships 3.0.
  set(_rmm_cccl "${STREAMALLOC_RMM_ROOT}/include/rapids")
  if(NOT STREAMALLOC_RMM_LIBRARY OR NOT STREAMALLOC_RAPIDS_LOGGER_LIBRARY)
    set(STREAMALLOC_BENCH_RMM_REASON "librmm.so or librapids_logger.so missing in ${STREAMALLOC_RMM_ROOT}")
  elseif(NOT EXISTS "${_rmm_cccl}/cuda/memory_resource")
    set(STREAMALLOC_BENCH_RMM_REASON "the CCCL headers RMM needs are missing in ${_rmm_cccl}")
  else()
    set(STREAMALLOC_BENCH_RMM ON)
    # Targets that use RMM put this first on their include path (SYSTEM BEFORE): where the CUDA
    # toolkit's include directory carries its own, older CCCL, an interface include of a library linked
    # earlier would otherwise come first.
    set(STREAMALLOC_RMM_CCCL_INCLUDE "${_rmm_cccl}")
    add_library(streamalloc_rmm INTERFACE IMPORTED)
    # SYSTEM: RMM's and CCCL's own warnings are not this project's.
    target_include_directories(streamalloc_rmm SYSTEM INTERFACE "${_rmm_cccl}" "${STREAMALLOC_RMM_ROOT}/include")
    target_link_libraries(streamalloc_rmm INTERFACE "${STREAMALLOC_RMM_LIBRARY}" "${STREAMALLOC_RAPIDS_LOGGER_LIBRARY}"
                                                    CUDA::cudart)
    # RMM's headers use C++20 (concepts).
    target_compile_features(streamalloc_rmm INTERFACE cxx_std_20)
    if(EXISTS "${STREAMALLOC_RMM_ROOT}/VERSIONS")
      file(STRINGS "${STREAMALLOC_RMM_ROOT}/VERSIONS" _rmm_versions)
      string(REPLACE ";" ", " STREAMALLOC_BENCH_RMM_REASON "${_rmm_versions}")
    endif()
  endif()
endif()
