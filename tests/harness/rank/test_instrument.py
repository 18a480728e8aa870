"""LossInstrument: counts, FP64 spot checks (against the independent reference), param-grad check, capture,
metric reductions, and "instrumentation does not change the training result"."""

import math

import pytest
import torch
from swift.rlhf_trainers.gkd_loss import TeacherOutput

from gkd_harness.bench.host_syncs import count_host_syncs
from gkd_harness.harness.loss.reference import reference_gkd, reference_jsd
from gkd_harness.harness.losses import make_gkd_loss, make_gkd_loss_terms
from gkd_harness.harness.rank.instrument import (
    CumulativeSumMetric,
    LossInstrument,
    MaxMetric,
    MinMetric,
    NonFiniteError,
    RatioMetric,
    SumMetric,
    build_metrics,
    spot_check,
)

BETA, T = 0.5, 0.9


def mixed_inputs(seed=0, b=2, s=7, v=64, noise=0.01, scale=2.0):
    """FP32 student, BF16 near-copy teacher (the seed's regime), labels with masked prompt positions."""
    g = torch.Generator().manual_seed(seed)
    student = (torch.randn(b, s, v, generator=g) * scale).bfloat16().float()
    teacher = (student + torch.randn(b, s, v, generator=g) * noise).bfloat16()
    labels = torch.randint(0, v, (b, s), generator=g)
    labels[:, :2] = -100
    return student, teacher, labels


def computed(metrics):
    """Compute every metric the way ms-swift's compute_custom_metrics does (single-value dicts unwrapped)."""
    out = {}
    for k, m in metrics.items():
        v = m.compute()
        out[k] = v["value"] if isinstance(v, dict) else v
    return out


def make_instrument(precision, **kw):
    return LossInstrument(
        make_gkd_loss_terms(precision, "paper"),
        make_gkd_loss_terms("fp64", "paper"),
        build_metrics(param_grad=kw.get("param_grad", False)),
        **kw,
    )


@pytest.mark.parametrize("precision", ["native", "fp32"])
def test_counts_match_an_independent_fp64_reference(precision):
    inst = make_instrument(precision, spot_every=1, spot_max_tokens=1000)
    rows = []
    for seed in range(3):
        s, t, labels = mixed_inputs(seed)
        total, n = inst(s.clone().requires_grad_(True), TeacherOutput(full_logits=t, labels=labels), labels, BETA, T)
        rows.append(float((total / n).detach()))
        inst.step += 1
    m = computed(inst.metrics)
    assert m["gkd/loss_calls_total"] == 3
    assert m["gkd/neg_loss_calls_total"] == sum(r < 0 for r in rows) == m["gkd/neg_loss_calls"]
    assert m["gkd/jsd_loss"] == pytest.approx(sum(rows) / 3, rel=1e-12)  # mean of the per-call losses
    assert m["gkd/nonfinite_calls_total"] == 0
    ref_rows = [
        reference_gkd(*mixed_inputs(seed)[::2], BETA, T, teacher_full=mixed_inputs(seed)[1])[0] for seed in range(3)
    ]
    assert all(r > 0 for r in ref_rows)  # JSD of normalized distributions is >= 0
    if precision == "native":
        assert m["gkd/neg_loss_calls_total"] == 3  # upstream arithmetic is negative on all three
        assert m["gkd/neg_token_frac"] > 0.5
    else:
        assert m["gkd/neg_loss_calls_total"] == 0
        assert m["gkd/min_token_jsd"] >= 0


def test_spot_check_values_against_reference():
    s, t, labels = mixed_inputs(5)
    teacher = TeacherOutput(full_logits=t, labels=labels)
    ref_total, ref_n, ref_grad = reference_gkd(s, labels, BETA, T, teacher_full=t)
    ref_loss = ref_total / ref_n
    for precision, _tol_loss, tol_grad in (("fp32", None, 1e-3), ("native", None, None)):
        vals = spot_check(
            make_gkd_loss_terms(precision, "paper"),
            make_gkd_loss_terms("fp64", "paper"),
            s,
            teacher,
            labels,
            BETA,
            T,
            max_tokens=10_000,
        )
        # the harness's FP64 side equals the independent reference
        assert vals["spot/loss_fp64"] == pytest.approx(ref_loss, rel=1e-10, abs=1e-15)
        abs_err = abs(vals["spot/loss"] - ref_loss)
        assert vals["spot/loss_abs_err"] == pytest.approx(abs_err, rel=1e-6, abs=1e-15)
        if precision == "fp32":
            assert abs_err <= 1e-4 * abs(ref_loss) + 2e-6
            assert vals["spot/grad_rel_l2"] <= tol_grad
            assert vals["spot/sign_mismatch"] == 0.0
        else:
            assert vals["spot/loss"] < 0 < ref_loss and vals["spot/sign_mismatch"] == 1.0
            assert vals["spot/grad_rel_l2"] > 0.05


def test_spot_check_caps_positions():
    s, t, labels = mixed_inputs(1, b=2, s=9)
    teacher = TeacherOutput(full_logits=t, labels=labels)
    vals = spot_check(
        make_gkd_loss_terms("fp32", "paper"),
        make_gkd_loss_terms("fp64", "paper"),
        s,
        teacher,
        labels,
        BETA,
        T,
        max_tokens=3,
    )
    active = s[labels != -100][:3]
    expect = reference_jsd(active, t[labels != -100][:3], BETA, "paper", T).mean()
    assert vals["spot/loss_fp64"] == pytest.approx(float(expect), rel=1e-10)


def test_topk_spot_check_against_reference():
    s, t, labels = mixed_inputs(2)
    topk = TeacherOutput(full_logits=t, labels=labels).to_topk(8)
    vals = spot_check(
        make_gkd_loss_terms("fp32", "paper"),
        make_gkd_loss_terms("fp64", "paper"),
        s,
        topk,
        labels,
        0.0,
        T,
        max_tokens=10_000,
    )
    total, n, _ = reference_gkd(s, labels, 0.0, T, teacher_topk=(topk.topk_logprobs, topk.topk_indices))
    assert vals["spot/loss_fp64"] == pytest.approx(total / n, rel=1e-10)
    assert vals["spot/grad_rel_l2"] <= 1e-3


@pytest.mark.parametrize("mode", ["full", "topk"])
def test_spot_check_in_row_chunks_equals_one_piece(mode, monkeypatch):
    """Issue 22: the full-vocabulary spot check runs row chunks (here 1 row each) and accumulates totals and norms;
    top-k works on the student gathered at the teacher's ids (a V = 64 student, K = 8). Both agree with the
    one-piece computation and with the independent reference."""
    import gkd_harness.harness.rank.instrument as instrument

    s, t, labels = mixed_inputs(8, noise=0.3)
    teacher = TeacherOutput(full_logits=t, labels=labels)
    if mode == "topk":
        teacher = teacher.to_topk(8)
    args = (make_gkd_loss_terms("fp32", "paper"), make_gkd_loss_terms("fp64", "paper"), s, teacher, labels, BETA, T)
    whole = spot_check(*args, max_tokens=9)
    monkeypatch.setattr(instrument, "SPOT_CHUNK_ELEMENTS", {"cpu": 1})
    chunked = spot_check(*args, max_tokens=9)
    assert chunked["spot/loss_fp64"] == pytest.approx(whole["spot/loss_fp64"], rel=1e-12)
    for k in ("spot/loss", "spot/grad_rel_l2"):  # fp32 totals summed in another grouping
        assert chunked[k] == pytest.approx(whole[k], rel=1e-6), k
    rows = labels != -100
    keep = torch.arange(int(rows.sum())) < 9
    if mode == "full":
        ref = reference_jsd(s[rows][keep], t[rows][keep], BETA, "paper", T).mean()
    else:
        s_k = torch.gather(s[rows][keep], -1, teacher.topk_indices[rows][keep])
        ref = reference_jsd(s_k, teacher.topk_logprobs[rows][keep], BETA, "paper", T).mean()
    assert whole["spot/loss_fp64"] == pytest.approx(float(ref), rel=1e-10)
    assert whole["spot/grad_rel_l2"] <= 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_spot_check_evaluates_each_variant_once_the_fp64_one_on_an_fp64_leaf(dtype):
    """Issue 22: a spot check evaluates the run's variant once (on the student's values, in its dtype) and the
    FP64 variant once (on the same values as an FP64 leaf), whatever the student's dtype; a BF16/FP16 student took
    a third evaluation before (the FP64 variant on a student-dtype leaf, besides the FP64 leaf for the dtype
    floor). The reference gradient is the FP64 gradient rounded once to the student's dtype: the comparison equals
    the one computed here from the bare loss's gradient and the independent FP64 reference's."""
    s, t, labels = mixed_inputs(4, b=2, s=9, v=64, noise=0.1)
    s = s.to(dtype)
    teacher = TeacherOutput(full_logits=t, labels=labels)
    seen = {"run": [], "ref": []}

    def counted(name, terms_fn):
        def terms(x, *args, **kwargs):
            seen[name].append(x.dtype)
            return terms_fn(x, *args, **kwargs)

        return terms

    vals = spot_check(
        counted("run", make_gkd_loss_terms("fp32", "paper")),
        counted("ref", make_gkd_loss_terms("fp64", "paper")),
        s,
        teacher,
        labels,
        BETA,
        T,
        max_tokens=10,
    )
    assert seen == {"run": [dtype], "ref": [torch.float64]}  # one row chunk at V = 64

    rows = labels != -100
    s_c, t_c = s[rows][:10][None], t[rows][:10][None]
    lab = torch.zeros(1, 10, dtype=torch.long)
    x = s_c.clone().requires_grad_(True)
    total, _ = make_gkd_loss("fp32", "paper")(x, TeacherOutput(full_logits=t_c, labels=lab), lab, BETA, T)
    (g_run,) = torch.autograd.grad(total, x)
    ref_total, n, g_ref = reference_gkd(s_c, lab, BETA, T, teacher_full=t_c)
    g64 = (g_ref * n).to(dtype).double()  # d total / d logits, as the student's dtype holds it
    expect = float((g_run.double() - g64).norm() / g64.norm())
    assert vals["spot/loss_fp64"] == pytest.approx(ref_total / n, rel=1e-12)
    assert vals["spot/grad_rel_l2"] == pytest.approx(expect, rel=1e-3)


def test_spot_check_extra_memory_is_at_most_the_loss_calls_own(monkeypatch):
    """Issue 22: the spot check's peak of live torch allocations (the profiler's memory timeline, inputs excluded)
    stays at or below the loss call's own forward+backward, and within a few FP64 row chunks, at a shape where the
    checked rows are a large share of the call (256 of 448 active positions, V = 32,768, BF16 student: the loss
    call's smallest peak). Before, the check ran its 256 rows in one chunk of 2^23 elements plus a third, FP64-leaf
    evaluation: 388 MiB against the loss call's 92 MiB."""
    import gkd_harness.harness.rank.instrument as instrument
    from gkd_harness.bench.measure import allocator_peak_mib

    monkeypatch.setattr(instrument, "SPOT_CHUNK_ELEMENTS", {"cpu": 1 << 20})  # the CPU default, pinned
    g = torch.Generator().manual_seed(0)
    v, s_len = 32768, 512
    s = (torch.randn(1, s_len, v, generator=g) * 2).bfloat16()
    t = (s.float() + 0.05 * torch.randn(1, s_len, v, generator=g)).bfloat16()
    labels = torch.ones(1, s_len, dtype=torch.long)
    labels[0, :64] = -100
    teacher = TeacherOutput(full_logits=t, labels=labels)
    run, ref, loss = make_gkd_loss_terms("fp32", "paper"), make_gkd_loss_terms("fp64", "paper"), make_gkd_loss("fp32")

    def loss_call():
        x = s.detach().requires_grad_(True)
        total, n = loss(x, teacher, labels, BETA, T)
        (total / n).backward()

    def check():
        return spot_check(run, ref, s, teacher, labels, BETA, T, max_tokens=256)

    loss_call(), check()  # lazy library state is not counted
    loss_mib, check_mib = allocator_peak_mib(loss_call), allocator_peak_mib(check)
    if loss_mib is None or check_mib is None:
        pytest.skip("the torch profiler's memory timeline is unavailable in this build")
    assert check_mib <= loss_mib, (check_mib, loss_mib)
    assert check_mib <= 8 * 8 * (1 << 20) / 2**20, check_mib  # 8 FP64 chunks of 2^20 elements (64 MiB)


def test_spot_check_takes_the_calls_arguments_by_position_or_name():
    """The extra gkd_loss arguments reach the check whether the trainer passes them by position or by name."""
    s, t, labels = mixed_inputs(9)
    teacher = TeacherOutput(full_logits=t, labels=labels).to_topk(8)
    calls = []

    def gather(logits, idx):
        calls.append(tuple(logits.shape))
        return torch.gather(logits, -1, idx)

    base = (make_gkd_loss_terms("fp32", "paper"), make_gkd_loss_terms("fp64", "paper"), s, teacher, labels, BETA, T, 5)
    by_pos = spot_check(*base, gather)
    by_name = spot_check(*base, gather_fn=gather)
    assert by_pos == by_name and calls and all(shape[-1] == 64 for shape in calls)


@pytest.mark.parametrize("precision", ["native", "fp32"])
def test_instrumentation_does_not_change_loss_or_gradient(precision, tmp_path):
    s, t, labels = mixed_inputs(3)
    teacher = TeacherOutput(full_logits=t, labels=labels)
    bare = make_gkd_loss(precision, "paper")
    x0 = s.clone().requires_grad_(True)
    total0, n0 = bare(x0, teacher, labels, BETA, T)
    (g0,) = torch.autograd.grad(total0 / n0, x0)

    inst = make_instrument(precision, spot_every=1, capture_dir=str(tmp_path))
    x1 = s.clone().requires_grad_(True)
    total1, n1 = inst(x1, teacher, labels, BETA, T)
    (g1,) = torch.autograd.grad(total1 / n1, x1)
    assert torch.equal(total0, total1) and int(n0) == int(n1)
    assert torch.equal(g0, g1)
    assert inst.close() == []  # the capture, queued on that call, is written
    assert list(tmp_path.glob("step1_rank0.safetensors"))


def test_param_grad_check_through_a_model():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 64)
    h = torch.randn(2, 7, 16)
    _, t, labels = mixed_inputs(4)
    teacher = TeacherOutput(full_logits=(model(h).detach() + 0.01 * torch.randn(2, 7, 64)).bfloat16(), labels=labels)
    results = {}
    for precision in ("native", "fp32"):
        inst = make_instrument(precision, spot_every=1, param_grad=True)
        inst.params = lambda: list(model.parameters())
        logits = model(h)
        total, n = inst(logits, teacher, labels, BETA, T)
        (total / n).backward()  # the graph is still usable after the check
        assert model.weight.grad is not None
        model.zero_grad()
        results[precision] = computed(inst.metrics)["spot/param_grad_rel_l2"]
    # independent: parameter gradient of the FP64 reference loss (on the same FP32 logits) vs the fp32 variant's
    logits = model(h)
    per = reference_jsd(logits[labels != -100], teacher.full_logits[labels != -100], BETA, "paper", T)
    g_ref = torch.autograd.grad(per.mean(), (model.weight, model.bias))
    total, n = make_gkd_loss("fp32", "paper")(model(h), teacher, labels, BETA, T)
    g32 = torch.autograd.grad(total / n, (model.weight, model.bias))
    rel = math.sqrt(sum(float((a.double() - r.double()).pow(2).sum()) for a, r in zip(g32, g_ref))) / math.sqrt(
        sum(float(r.double().pow(2).sum()) for r in g_ref)
    )
    assert results["fp32"] == pytest.approx(rel, rel=0.05, abs=1e-7)
    assert results["fp32"] < 1e-3 < results["native"]


def test_metrics_reduce_without_process_group():
    m = SumMetric()
    assert m.compute() is None
    m.update(2), m.update(3)
    assert m.compute() == 5
    c = CumulativeSumMetric()
    c.update(1), c.update(1)
    assert c.compute() == 2
    c.reset()
    c.update(1)
    assert c.compute() == 3
    lo, hi, r = MinMetric(), MaxMetric(), RatioMetric()
    assert lo.compute() is None and hi.compute() is None and r.compute() is None
    for v in (0.5, -1.0, 2.0):
        lo.update(v), hi.update(v)
    r.update(1, 4), r.update(1, 4)
    assert (lo.compute(), hi.compute(), r.compute()) == (-1.0, 2.0, 0.25)


def test_nonfinite_calls_are_counted():
    s, t, labels = mixed_inputs(6)
    s[0, 3, 0] = float("nan")
    inst = make_instrument("fp32")
    inst(s, TeacherOutput(full_logits=t, labels=labels), labels, BETA, T)
    m = computed(inst.metrics)
    assert m["gkd/nonfinite_calls_total"] == 1 and m["gkd/neg_loss_calls_total"] == 0


# ----------------------------------------------------------------------------------------------------------
# NaN / Inf are recorded as themselves; fail_on_nonfinite
# ----------------------------------------------------------------------------------------------------------
def test_nonfinite_call_is_logged_as_nan_not_dropped():
    s, t, labels = mixed_inputs(6)
    s[0, 3, 0] = float("nan")
    inst = make_instrument("fp32")
    inst(s, TeacherOutput(full_logits=t, labels=labels), labels, BETA, T)
    s2, t2, labels2 = mixed_inputs(7)
    inst(s2, TeacherOutput(full_logits=t2, labels=labels2), labels2, BETA, T)  # a finite call in the same window
    m = computed(inst.metrics)
    assert m["gkd/loss_calls_total"] == 2 and m["gkd/nonfinite_calls_total"] == 1
    assert math.isnan(m["gkd/jsd_loss"])  # the window's mean is NaN, never the finite call's value or 0
    assert math.isnan(m["gkd/min_token_jsd"])


def test_inf_call_is_logged_as_inf():
    s, t, labels = mixed_inputs(6)
    terms = make_gkd_loss_terms("fp32", "paper")

    def inf_terms(*a, **k):
        out = terms(*a, **k)
        return type(out)(out.total + float("inf"), out.num_valid, out.per_position)

    inst = LossInstrument(inf_terms, make_gkd_loss_terms("fp64", "paper"), build_metrics())
    inst(s, TeacherOutput(full_logits=t, labels=labels), labels, BETA, T)
    m = computed(inst.metrics)
    assert m["gkd/jsd_loss"] == math.inf and m["gkd/nonfinite_calls_total"] == 1


def test_nan_spot_check_is_a_failed_check_logged_as_nan():
    s, t, labels = mixed_inputs(6)
    s[0, 3, 0] = float("nan")
    inst = make_instrument("fp32", spot_every=1, spot_max_tokens=1000)
    inst(s, TeacherOutput(full_logits=t, labels=labels), labels, BETA, T)
    m = computed(inst.metrics)
    for name in ("spot/loss", "spot/loss_abs_err", "spot/loss_rel_err", "spot/grad_rel_l2", "spot/sign_mismatch"):
        assert math.isnan(m[name]), name


def test_min_max_metrics_keep_nan():
    lo, hi = MinMetric(), MaxMetric()
    for v in (0.5, float("nan"), 2.0):
        lo.update(v), hi.update(v)
    assert math.isnan(lo.compute()) and math.isnan(hi.compute())
    lo.reset(), hi.reset()
    lo.update(1.0), hi.update(1.0)
    assert (lo.compute(), hi.compute()) == (1.0, 1.0)  # the flag is window state: reset clears it


def test_fail_on_nonfinite_stops_naming_the_step():
    """The calls are read at the logging step (one transfer for all of them): the stop names the step of the
    first non-finite call, after recording it."""
    s, t, labels = mixed_inputs(6)
    s[0, 3, 0] = float("nan")
    inst = make_instrument("fp32", fail_on_nonfinite=True)
    s1, t1, labels1 = mixed_inputs(5)
    inst.step = 6
    inst(s1, TeacherOutput(full_logits=t1, labels=labels1), labels1, BETA, T)
    inst.step = 7
    inst(s, TeacherOutput(full_logits=t, labels=labels), labels, BETA, T)
    inst(s, TeacherOutput(full_logits=t, labels=labels), labels, BETA, T)
    with pytest.raises(NonFiniteError, match=r"non-finite GKD loss at step 7"):
        computed(inst.metrics)
    m = computed(inst.metrics)  # recorded before stopping
    assert m["gkd/nonfinite_calls_total"] == 2 and m["gkd/loss_calls_total"] == 3
    ok = make_instrument("fp32", fail_on_nonfinite=True)
    s2, t2, labels2 = mixed_inputs(7)
    ok(s2, TeacherOutput(full_logits=t2, labels=labels2), labels2, BETA, T)  # finite: no error


# ----------------------------------------------------------------------------------------------------------
# where the metrics live: bound by training, never at import / build time
# ----------------------------------------------------------------------------------------------------------
def test_metric_device_is_bound_by_the_loss_inputs():
    metrics = build_metrics()
    where = metrics["gkd/jsd_loss"].where
    assert where.device is None and all(m.where is where for m in metrics.values())
    where.bind_rank_device("meta")  # train begin on a rank: fills an unset device
    assert where.device == torch.device("meta") and where.source == "rank device"
    inst = LossInstrument(make_gkd_loss_terms("fp32", "paper"), make_gkd_loss_terms("fp64", "paper"), metrics)
    s, t, labels = mixed_inputs(0)
    inst(s, TeacherOutput(full_logits=t, labels=labels), labels, BETA, T)
    assert where.device == torch.device("cpu") and where.source == "loss inputs"  # the loss inputs win
    where.bind_rank_device("meta")
    assert where.device == torch.device("cpu")


# ----------------------------------------------------------------------------------------------------------
# device-to-host synchronisations per loss call
# ----------------------------------------------------------------------------------------------------------
def test_sync_counter_sees_each_kind_of_host_read():
    x = torch.randn(4)
    for fn, expect in (
        (lambda: x.sum().item(), 1),
        (lambda: float(x[0]), 1),
        (lambda: bool(x[0] > 0), 1),
        (lambda: x.tolist(), 1),
        (lambda: x[x > 0], 1),
        (lambda: x.nonzero(), 1),
        (lambda: (x * 2).exp(), 0),
    ):
        assert len(count_host_syncs(fn)) == expect


@pytest.mark.parametrize("precision", ["native", "fp32"])
@pytest.mark.parametrize("teacher_kind", ["full", "topk"])
def test_instrument_adds_no_host_sync_per_loss_call_and_one_per_logging_step(tmp_path, precision, teacher_kind):
    """Issue 46, item 6. Monitoring on: the plugin's loss (dtype boundary + instrument, spot checks off) makes the
    bare loss's own synchronisations and no more (before: + 1, a ``.tolist()`` per call, i.e. per micro-batch on
    Megatron's last stage); the logging step reads every queued call in one transfer. Monitoring off: the plugin's
    loss (dtype boundary only) adds 0."""
    from gkd_harness.harness.rank.plugin import build_loss

    s, t, labels = mixed_inputs(3, b=2, s=9, v=96)
    teacher = TeacherOutput(full_logits=t, labels=labels)
    if teacher_kind == "topk":
        teacher = teacher.to_topk(8)
    args = (s.clone().requires_grad_(True), teacher, labels, BETA, T)
    bare = count_host_syncs(make_gkd_loss(precision, "paper"), *args)
    from gkd_harness.harness.launcher.compose import point_config
    from gkd_harness.harness.launcher.run import plugin_settings

    ov = ["loss=fp32" if precision == "fp32" else "loss=original", "monitor.spot_check.every_n_steps=0"]
    cfg, run_dir = point_config(ov, run_dir=tmp_path)
    settings = plugin_settings(cfg, run_dir)
    on, inst = build_loss(settings, cfg)
    assert inst is not None
    with_monitor = [count_host_syncs(on, *args) for _ in range(3)]  # three micro-batches of one logging step
    assert with_monitor == [bare] * 3, (bare, with_monitor)
    logged = {}
    assert count_host_syncs(lambda: logged.update(computed(inst.metrics))) == ["tolist"]  # the step's one transfer
    assert logged["gkd/loss_calls_total"] == 3
    cfg.monitor.enabled = False
    off, none = build_loss(settings, cfg)
    assert none is None
    assert count_host_syncs(off, *args) == bare


@pytest.mark.parametrize("mode", ["full", "topk"])
def test_a_loss_that_writes_into_its_teacher_does_not_fool_the_spot_check(mode):
    """Issue 30 item 1: the spot check is built from copies taken before the loss call. A loss that is right on the
    tensor it leaves behind but halves the caller's teacher in place (``mul_(0.5)``) first: judged against the
    caller's inputs, its loss and gradient are far off FP64; built after the call, the check compared it with FP64
    on the halved tensor and passed (~1e-6)."""
    from gkd_harness.harness.loss.candidate import candidate_terms

    fp32 = make_gkd_loss("fp32")

    def writes_into_teacher(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs):
        t = teacher_output.full_logits if teacher_output.full_logits is not None else teacher_output.topk_logprobs
        t.mul_(0.5)  # "stabilising" the caller's tensor
        return fp32(student_logits, teacher_output, labels, beta, temperature, *args, **kwargs)

    g = torch.Generator().manual_seed(3)
    s = torch.randn(1, 6, 32, generator=g) * 2
    t = (s + 0.5 * torch.randn(1, 6, 32, generator=g)).bfloat16()
    labels = torch.zeros(1, 6, dtype=torch.long)
    teacher = TeacherOutput(full_logits=t.clone(), labels=labels)
    if mode == "topk":
        teacher = teacher.to_topk(8)
    original = teacher.full_logits.clone() if mode == "full" else teacher.topk_logprobs.clone()
    inst = LossInstrument(
        candidate_terms(writes_into_teacher),
        make_gkd_loss_terms("fp64"),
        build_metrics(),
        spot_every=1,
        spot_max_tokens=64,
    )
    inst(s.clone().requires_grad_(True), teacher, labels, 0.5, 0.9)
    after = teacher.full_logits if mode == "full" else teacher.topk_logprobs
    assert torch.equal(after, original * 0.5)  # the loss did write into the caller's tensor
    vals = computed(inst.metrics)
    # the independent reference on the caller's inputs, against what the loss computed on the halved tensor
    kw = {"teacher_full": original} if mode == "full" else {"teacher_topk": (original, teacher.topk_indices)}
    ref_total, n, _ = reference_gkd(s, labels, 0.5, 0.9, **kw)
    assert vals["spot/loss_fp64"] == pytest.approx(ref_total / n, rel=1e-9)
    assert vals["spot/loss_rel_err"] > 0.1 and vals["spot/grad_rel_l2"] > 0.1, vals
