# Backward kernel instantiations, generated from the FLASH4_DTYPES x FLASH4_HEAD_DIMS matrix like the forward's
# (included by kernels.cmake, which sets FLASH4_GENERATED_DIR and adds FLASH4_CUDA_SOURCES to the library).
# Per (dtype, head dim) three translation units, so the matrix compiles in parallel: the mma.sync kernel, the
# wgmma kernel (each with both mask variants) and the wgmma kernel of packed batches; bwd_configs.inc lists the
# compiled sets for bwd_api.cu's dispatch.
# The wgmma kernel also has native 96 (built with 128) and 192 (the role-split kernel, built with 256); the
# mma.sync kernel has neither (head_dims.h). bwd_configs.inc lists both sets: FLASH4_BWD_CONFIGS (mma.sync) and
# FLASH4_BWD_WGMMA_CONFIGS.
set(FLASH4_BWD_CONFIGS "")
set(FLASH4_BWD_WGMMA_CONFIGS "")
set(FLASH4_BWD_WGMMA_HEAD_DIMS ${FLASH4_HEAD_DIMS})
if("128" IN_LIST FLASH4_HEAD_DIMS)
  list(APPEND FLASH4_BWD_WGMMA_HEAD_DIMS 96)
endif()
if("256" IN_LIST FLASH4_HEAD_DIMS)
  list(APPEND FLASH4_BWD_WGMMA_HEAD_DIMS 192)
endif()
foreach(dtype IN LISTS FLASH4_DTYPES)
  flash4_element_type(${dtype} ctype)
  foreach(hdim IN LISTS FLASH4_HEAD_DIMS)
    flash4_generate_tu(bwd_mma_sync_${dtype}_hd${hdim} "one mma.sync backward instantiation (both mask variants)"
      kernels/sm90/bwd/bwd_mma_sync_launch.cuh
      "void flash4::sm90::launch_bwd_mma_sync<${ctype}, ${hdim}>(const flash4::sm90::BwdParams&, bool, cudaStream_t)")
    string(APPEND FLASH4_BWD_CONFIGS "  X(${ctype}, ${hdim})\\\n")
  endforeach()
  foreach(hdim IN LISTS FLASH4_BWD_WGMMA_HEAD_DIMS)
    flash4_generate_tu(bwd_wgmma_${dtype}_hd${hdim} "one wgmma backward instantiation (both mask variants)"
      kernels/sm90/bwd/bwd_wgmma_launch.cuh
      "void flash4::sm90::launch_bwd_wgmma<${ctype}, ${hdim}>(const flash4::sm90::bwd::BwdWgmmaParams&, bool, cudaStream_t)")
    flash4_generate_tu(bwd_wgmma_packed_${dtype}_hd${hdim}
      "one wgmma backward instantiation for packed and seqused batches (both mask variants)"
      kernels/sm90/bwd/bwd_wgmma_launch.cuh
      "void flash4::sm90::launch_bwd_wgmma_packed<${ctype}, ${hdim}>(const flash4::sm90::bwd::BwdWgmmaParams&, bool, cudaStream_t)")
    string(APPEND FLASH4_BWD_WGMMA_CONFIGS "  X(${ctype}, ${hdim})\\\n")
  endforeach()
endforeach()
# The (192, 128) role-split kernels (v narrower than q / k: bwd_has_split_kernel), built with the 192 ones.
set(FLASH4_BWD_WGMMA_SPLIT_CONFIGS "")
if("192" IN_LIST FLASH4_BWD_WGMMA_HEAD_DIMS)
  foreach(dtype IN LISTS FLASH4_DTYPES)
    flash4_element_type(${dtype} ctype)
    foreach(kind IN ITEMS "" "_packed")
      flash4_generate_tu(bwd_wgmma${kind}_${dtype}_hd192_128
        "one (192, 128) wgmma backward instantiation (both mask variants)" kernels/sm90/bwd/bwd_wgmma_launch.cuh
        "void flash4::sm90::launch_bwd_wgmma_split${kind}<${ctype}, 192, 128>(const flash4::sm90::bwd::BwdWgmmaParams&, bool, cudaStream_t)")
    endforeach()
    string(APPEND FLASH4_BWD_WGMMA_SPLIT_CONFIGS "  X(${ctype}, 192, 128)\\\n")
  endforeach()
endif()
file(CONFIGURE OUTPUT ${FLASH4_GENERATED_DIR}/bwd_configs.inc CONTENT
     "// Generated: the compiled backward configurations (dtype, head_dim): the mma.sync kernel's and the wgmma kernel's (both masks each).\n#define FLASH4_BWD_CONFIGS(X) \\\n${FLASH4_BWD_CONFIGS}\n#define FLASH4_BWD_WGMMA_CONFIGS(X) \\\n${FLASH4_BWD_WGMMA_CONFIGS}\n#define FLASH4_BWD_WGMMA_SPLIT_CONFIGS(X) \\\n${FLASH4_BWD_WGMMA_SPLIT_CONFIGS}\n")
