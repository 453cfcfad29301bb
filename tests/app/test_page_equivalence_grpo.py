"""The Equivalence page's GRPO section: dapo's gradient scale at each k, measured live (TRL's GRPOTrainer on the
bench's tiny Qwen2), its headline read from the table it sits on, and the audit's first-step verdicts beside it."""

from app_support import open_app, run_until

CHECK_TIMEOUT_S = 120


def test_the_grpo_check_shows_dapos_scale_moving_with_k_and_exact_at_k_equal_to_steps_per_generation(app_home):
    at = open_app("equivalence")
    assert "GRPO: a loss type whose scale moves with k" in [header.value for header in at.header]
    at.button(key="run_grpo_check").click().run()
    run_until(at, lambda at: not at.status, CHECK_TIMEOUT_S, "the GRPO check", every=0.5)
    assert not at.exception

    table = next(frame.value for frame in at.dataframe if "audit (first step)" in frame.value.columns)
    assert list(table["k"]) == [1, 1, 1, 1, 2, 2, 4]  # one generation of 4 micro-batches: 4 ÷ k steps
    assert (table["residual"] < 1e-4).all()  # each step is a plain scale of its window's objective
    by_k = {k: list(table[table["k"] == k]["scale"]) for k in (1, 2, 4)}
    assert abs(by_k[4][0] - 1) < 1e-4 and any(abs(s - 1) > 1e-3 for s in by_k[1] + by_k[2])
    firsts = dict(zip(table[table["step"] == 1]["k"], table[table["step"] == 1]["audit (first step)"]))
    assert firsts == {1: "normalised_by_generation_batch", 2: "normalised_by_generation_batch", 4: "exact"}

    headline = next(m.value for m in at.markdown if m.value.startswith("**dapo at steps_per_generation = 4"))
    for k, scales in by_k.items():  # every number in the sentence is the table's
        assert f"k = {k}: " + ", ".join(f"{s:.3f}×" for s in scales) in headline
    assert "exact only at k = 4" in headline
    assert "the fix is steps_per_generation = gradient_accumulation_steps" in headline
