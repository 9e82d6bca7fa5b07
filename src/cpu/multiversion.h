// Per-CPU code paths for the hot CPU tile functions. The library is built for baseline x86-64-v2 (it must run on
// any x86-64 machine), which has no FMA or AVX2; GCC/Clang's target_clones additionally compile a function (and
// everything inlined into it) for x86-64-v3 and pick the version at load time. Measured on a 2-core CI machine:
// forward at (1, 4096, 16, 128) bf16 from 35 to 48 GFLOP/s with exact exp2, from 32 to 53 with the polynomial.
#pragma once

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(FLASH4_NO_MULTIVERSION)
#define FLASH4_CPU_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FLASH4_CPU_MULTIVERSION
#endif
