# Decode (KV-cache) attention kernel instantiations, one translation unit per (dtype, head dim) of the
# FLASH4_DTYPES x FLASH4_HEAD_DIMS matrix, each with both row shapes (decode_config.h); decode_configs.inc lists
# the compiled set for decode_api.cu's dispatch. Included by kernels.cmake (appends to FLASH4_CUDA_SOURCES).
set(FLASH4_DECODE_CONFIGS "")
foreach(dtype IN LISTS FLASH4_DTYPES)
  flash4_element_type(${dtype} ctype)
  foreach(hdim IN LISTS FLASH4_HEAD_DIMS)
    flash4_generate_tu(decode_${dtype}_hd${hdim} "one decode attention instantiation (both row shapes)"
      kernels/sm90/decode/decode_launch.cuh
      "void flash4::sm90::decode::launch_decode<${ctype}, ${hdim}>(const flash4::sm90::decode::DecodeParams&, bool, cudaStream_t)")
    string(APPEND FLASH4_DECODE_CONFIGS "  X(${ctype}, ${hdim})\\\n")
  endforeach()
endforeach()
file(CONFIGURE OUTPUT ${FLASH4_GENERATED_DIR}/decode_configs.inc CONTENT
     "// Generated: the compiled decode attention configurations (dtype, head_dim).\n#define FLASH4_DECODE_CONFIGS(X) \\\n${FLASH4_DECODE_CONFIGS}\n")
