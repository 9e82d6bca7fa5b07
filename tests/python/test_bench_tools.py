"""The Python benchmark's host-side pieces (bench/): argument checks, the implementation names, the tables and the
results file built from sample records, and the pre-timing output check on the CPU. The timings themselves need
the GPU (scripts/device-check.sh, stages bench-py and peers)."""
import importlib.util
import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")


def load(name):
    """A bench/ script as a module (bench/ is not a package; its scripts import each other by file name)."""
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(BENCH, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(impl, d, s, causal, tflops=None, error=None):
    rec = dict(impl=impl, b=16384 // s, s=s, h=2048 // d, d=d, causal=causal)
    if error is not None:
        rec["error"] = error
    else:
        rec.update(ms=1.0, tflops=tflops, pass_="forward", ms_rounds=[1.0])
    return rec


@pytest.fixture
def sample(tmp_path):
    """JSON lines as sdpa_bench.py prints them: the meta line, timings, one failed check."""
    lines = [{"meta": {"torch": "2.11.0", "cudnn": 91900, "flash_attn_4": "4.0.0b36", "gpu": "NVIDIA H200"}},
             record("flash4", 128, 4096, False, 611.0), record("fa4", 128, 4096, False, 635.0),
             record("cudnn", 128, 4096, False, 603.0), record("flash4", 64, 1024, True, 260.0),
             record("fa4", 64, 1024, True, error="check failed: out[b=0,h=0]: non-finite values")]
    path = tmp_path / "fwd.jsonl"
    path.write_text("# a note line\n" + "\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_impl_names_are_checked():
    impls = load("attention_impls")
    assert impls.parse_impls("flash4, fa4,cudnn,fa4") == ["flash4", "fa4", "cudnn"]
    with pytest.raises(ValueError, match="--impls.*unknown: fa5"):
        impls.parse_impls("flash4,fa5")
    with pytest.raises(ValueError, match="--impls"):
        impls.parse_impls(" , ")


def test_bench_arguments(capsys):
    bench = load("sdpa_bench")
    args = bench.parse_args(["--impls", "fa4,flash4", "--dims", "64,96,192,256", "--seqlens", "1024,16384", "--single"])
    assert args.impls == ["fa4", "flash4"] and args.dims == [64, 96, 192, 256] and args.seqlens == [1024, 16384]
    assert [bench.heads_for(d) for d in args.dims] == [32, 21, 11, 8]
    assert args.single and not args.backward and args.bwd_method == "subtract"
    for bad, what in ((["--impls", "fa3"], "--impls"), (["--dims", "100"], "--dims"),
                      (["--seqlens", "1000"], "--seqlens"), (["--dims", "x"], "--dims"),
                      (["--rounds", "0"], "--rounds")):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
        assert what in capsys.readouterr().err


def test_compare_table_has_fa4_ratio_and_errors(sample):
    compare = load("compare")
    text = compare.format_table(compare.read_records([str(sample)]))
    lines = text.splitlines()
    assert lines[0].split()[-2:] == ["flash4/cudnn", "flash4/fa4"]
    row = next(x for x in lines if x.split()[:3] == ["128", "False", "4096"]).split()
    assert row[3:6] == ["611.0", "635.0", "603.0"]
    assert row[-2:] == [f"{611 / 603:.2f}", f"{611 / 635:.2f}"]
    assert any(x.startswith("error: fa4 d=64 causal=True s=1024: check failed") for x in lines)


def test_report_records_versions_and_renders_fa4(sample, tmp_path, monkeypatch):
    report = load("report")
    out, md = tmp_path / "results.json", tmp_path / "tables.md"
    monkeypatch.setattr(sys, "argv", ["report.py", "collect", "--out", str(out), "--gpu", "H200", "--commit",
                                      "abc1234", "--date", "2026-12-01", "--forward", str(sample)])
    report.main()
    res = json.loads(out.read_text())
    assert res["versions"] == {"torch": "2.11.0", "cudnn": 91900, "flash_attn_4": "4.0.0b36"}
    assert len(res["forward"]) == 4  # the failed check has no timing
    monkeypatch.setattr(sys, "argv", ["report.py", "render", str(out), "--markdown", str(md)])
    report.main()
    text = md.read_text()
    assert "flash_attn_4 4.0.0b36" in text.splitlines()[0]
    assert "| d | causal | seqlen | flash4 | fa4 | cudnn | flash4 / cudnn | flash4 / fa4 |" in text
    assert f"| 128 | no | 4096 | 611 | 635 | 603 | {611 / 603:.2f} | {611 / 635:.2f} |" in text


def _attention(torch):
    import torch.nn.functional as F

    def fwd(q, k, v, causal):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=causal).transpose(1, 2)
    return fwd


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_output_check_passes_attention_and_fails_wrong_results(backward, causal):
    torch = pytest.importorskip("torch")
    check = load("output_check")
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(2, 96, 3, 32, generator=gen, dtype=torch.bfloat16) for _ in range(4))
    for x in (q, k, v):
        x.requires_grad_(backward)
    good = _attention(torch)
    assert check.check_impl(good, q, k, v, dout if backward else None, causal) is None

    def unscaled(q, k, v, causal):  # a plausible bug: the softmax scale left out
        return good(q * q.shape[-1] ** 0.5, k, v, causal)

    def unwritten(q, k, v, causal):  # part of the output never written: it keeps the poison
        out = good(q, k, v, causal)
        return torch.cat([out[:, :-1], torch.full_like(out[:, -1:], float("nan"))], dim=1)

    why = check.check_impl(unscaled, q, k, v, dout if backward else None, causal)
    assert why is not None and "max error" in why
    why = check.check_impl(unwritten, q, k, v, dout if backward else None, causal)
    assert why is not None and "non-finite" in why


def test_shapes_bench_parses_shapes_and_names_bad_ones():
    shapes = load("shapes_bench")
    assert shapes.parse_shapes("1:4096:8:1:128,2:300:6:2:64:c") == [(1, 4096, 8, 1, 128, False),
                                                                     (2, 300, 6, 2, 64, True)]
    assert len(shapes.parse_shapes(shapes.DEFAULT_SHAPES)) >= 10
    for bad in ("1:4096:8:3:128", "1:4096:8", "1:4096:8:1:100", "1:4096:8:1:128:x", "a:1:1:1:8"):
        with pytest.raises(ValueError, match="--shapes"):
            shapes.parse_shapes(bad)


@pytest.mark.parametrize("backward", [False, True])
def test_shapes_bench_check_judges_gqa_groups(backward):
    """The GQA-aware check: correct grouped attention passes (dk, dv summed over the group), a kernel that pairs
    query heads with the wrong kv head fails."""
    torch = pytest.importorskip("torch")
    shapes = load("shapes_bench")
    gen = torch.Generator().manual_seed(1)
    q, dout = (torch.randn(2, 40, 6, 32, generator=gen, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(2, 40, 2, 32, generator=gen, dtype=torch.bfloat16) for _ in range(2))
    for x in (q, k, v):
        x.requires_grad_(backward)
    attend = _attention(torch)

    def grouped(q, k, v, causal):  # query head h reads kv head h // 3
        return attend(q, k.repeat_interleave(3, dim=2), v.repeat_interleave(3, dim=2), causal)

    def interleaved(q, k, v, causal):  # query head h reads kv head h % 2: the wrong grouping
        return attend(q, k.repeat(1, 1, 3, 1), v.repeat(1, 1, 3, 1), causal)

    assert shapes.check(grouped, q, k, v, dout if backward else None, True) is None
    why = shapes.check(interleaved, q, k, v, dout if backward else None, True)
    assert why is not None and "max error" in why
