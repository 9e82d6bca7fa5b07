"""scripts/kernel_resources.py: the record of the kernels' compiled resources, checked without a GPU. A stand-in
cuobjdump (a shell script printing canned -res-usage and -sass output) drives the script end to end."""
import json
import os
import stat
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "kernel_resources.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import kernel_resources as kr  # noqa: E402

RES_USAGE = """
member lib.a:api.cpp.o:

member lib.a:fwd.cu.o:

Fatbin elf code:
================
arch = sm_90a
Resource usage:
 Function _Z3fwdv:
  REG:168 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:1664 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z3bwdv:
  REG:168 STACK:48 SHARED:0 LOCAL:0 CONSTANT[0]:1000 TEXTURE:0 SURFACE:0 SAMPLER:0
"""

SASS = """
\tcode for sm_90a
\t\tFunction : _Z3fwdv
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR16], RZ, !UPT ;
\t\tFunction : _Z3bwdv
        /*0000*/                   STL [R1+0x8], R4 ;
        /*0010*/              @!P0 LDL.64 R6, [R1+0x10] ;
        /*0020*/                   LDS R2, [R3] ;
"""


def test_parsers_read_each_kernel():
    assert kr.parse_res_usage(RES_USAGE) == {
        "_Z3fwdv": {"registers": 168, "stack": 0, "shared": 1024, "local": 0},
        "_Z3bwdv": {"registers": 168, "stack": 48, "shared": 0, "local": 0}}
    assert kr.count_spill_ops(SASS) == {"_Z3fwdv": 0, "_Z3bwdv": 2}  # LDS is shared memory, not a spill


def test_anonymous_namespaces_keep_their_file_not_their_path_hashes():
    # nvcc names an anonymous namespace after hashes of the source's path: another checkout, another name.
    a = "_ZN6flash44sm9045_GLOBAL__N__34688def_12_fwd_empty_cu_6324cced14clear_all_rowsENS1_8RowsViewEPKflll"
    b = "_ZN6flash44sm9045_GLOBAL__N__0badf00d_12_fwd_empty_cu_1234567814clear_all_rowsENS1_8RowsViewEPKflll"
    want = "_ZN6flash44sm9024_GLOBAL__N__fwd_empty_cu14clear_all_rowsENS1_8RowsViewEPKflll"
    assert kr.stable_name(a) == want and kr.stable_name(b) == want
    assert kr.stable_name("_Z3fwdv") == "_Z3fwdv"


def test_compare_flags_more_new_less_and_absent():
    base = {"registers": 168, "stack": 0, "shared": 0, "local": 0, "spill_ops": 0}
    record = {"a": base, "b": {**base, "spill_ops": 4}, "gone": base}
    built = {"a": {**base, "stack": 8}, "b": {**base, "spill_ops": 2}, "new": base}
    problems, gains, absent = kr.compare(built, record)
    assert len(problems) == 2 and "stack 0 -> 8" in problems[0] and "not in the record" in problems[1]
    assert gains == ["b: spill_ops 4 -> 2"] and absent == ["gone"]


@pytest.fixture
def fake_cuobjdump(tmp_path):
    """A cuobjdump that prints the canned texts, and an empty file standing for the library."""
    (tmp_path / "res.txt").write_text(RES_USAGE)
    (tmp_path / "sass.txt").write_text(SASS)
    tool = tmp_path / "cuobjdump"
    tool.write_text(f'#!/bin/sh\nif [ "$1" = -res-usage ]; then cat {tmp_path}/res.txt\n'
                    f'else cat {tmp_path}/sass.txt; fi\n')
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "lib.a").write_bytes(b"")
    return tmp_path


def run_script(d, action):
    return subprocess.run([sys.executable, SCRIPT, action, str(d / "lib.a"), "--record", str(d / "record.json"),
                           "--cuobjdump", str(d / "cuobjdump")], capture_output=True, text=True)


def test_update_then_check_passes_and_a_new_spill_fails(fake_cuobjdump):
    d = fake_cuobjdump
    assert run_script(d, "update").returncode == 0
    assert json.loads((d / "record.json").read_text())["_Z3bwdv"]["spill_ops"] == 2
    done = run_script(d, "check")
    assert done.returncode == 0, done.stdout
    (d / "sass.txt").write_text(SASS + "        /*0030*/                   STL [R1+0x18], R9 ;\n")
    done = run_script(d, "check")
    assert done.returncode == 1 and "MORE THAN RECORDED" in done.stdout and "spill_ops 2 -> 3" in done.stdout


def test_missing_tool_or_library_is_a_clear_error(fake_cuobjdump, tmp_path):
    d = fake_cuobjdump
    done = subprocess.run([sys.executable, SCRIPT, "check", str(tmp_path / "nothing.a"), "--cuobjdump",
                           str(d / "cuobjdump")], capture_output=True, text=True)
    assert done.returncode != 0 and "does not exist" in done.stderr
