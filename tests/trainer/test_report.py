from posttrain.trainer.report import FIRST_SAMPLES, Sample, load_samples, save_samples, series, write_report
from posttrain.trainer.tracking import Tracking


def test_report_plots_logged_metrics_and_quotes_samples(tmp_path):
    tracking = Tracking(["jsonl"], run_dir=tmp_path, project="p", experiment="e", total_steps=3)
    tracking.log({"val/arith/acc/mean@1": 0.1}, 0)
    for step in (1, 2, 3):
        tracking.log({"critic/score/mean": step / 10, "response_length/mean": 20 + step, "actor/ppo_kl": 0.01 * step,
                      "memory/policy/rss_gb": 3.0 + step, "reward/samples": 8, "reward/errors": 0, "reward/overlong_fraction": 0.1,  # no parts
                      "reward/polite": 0.25 * step, "reward/polite/errors": 1, "reward/polite/unparsable": step - 1}, step)
    tracking.log({"val/arith/acc/mean@1": 0.3, "val/arith/reward/mean@1": 0.5}, 3)
    tracking.close()
    report = write_report(tmp_path, [Sample("1+1=?", "#### 3", 0.0)], [Sample("1+1=?", "#### 2", 1.0)])
    text = report.read_text()
    pngs = sorted(p.name for p in (tmp_path / "report").glob("*.png"))
    assert pngs == ["kl.png", "memory.png", "response_length.png", "reward.png", "rubric.png", "validation_accuracy.png"]
    assert all((tmp_path / "report" / p).stat().st_size > 1000 for p in pngs)
    assert "![reward](reward.png)" in text and "> #### 2" in text and "**score 1**" in text
    assert "- `val/arith/acc/mean@1`: 0.100 (step 0) → 0.300 (step 3)" in text  # the run's first validation → its last
    # a rubric's parts (not the reward path's own counts), with their failures over the run
    assert "- `reward/polite`: 0.250 (step 1) → 0.750 (step 3); 3 failed, 3 unread (judge) over the run" in text
    assert "reward/samples" not in text and "reward/overlong_fraction" not in text and "![rubric](rubric.png)" in text
    from posttrain.trainer.tracking import read_jsonl

    val = series(read_jsonl(tmp_path / "metrics.jsonl"), ("val/",))
    assert list(val) == ["val/arith/acc/mean@1"]  # accuracies only, not other val metrics
    assert val["val/arith/acc/mean@1"] == ([0, 3], [0.1, 0.3])
    assert series(read_jsonl(tmp_path / "metrics.jsonl"), ("memory/",)) == {"memory/policy/rss_gb": ([1, 2, 3], [4.0, 5.0, 6.0])}


def test_the_first_validations_samples_survive_a_resume(tmp_path):
    samples = [Sample("2+2=?", "#### 4", 1.0), Sample("héllo", "", 0.0)]
    save_samples(tmp_path / "report" / FIRST_SAMPLES, samples)
    assert load_samples(tmp_path / "report" / FIRST_SAMPLES) == samples
    assert load_samples(tmp_path / "nothing.json") == []
