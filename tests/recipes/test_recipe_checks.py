"""A recipe checks every stage's config before its first stage runs (posttrain/recipes/checks.py)."""

import pytest

from posttrain.recipes import RecipeError, builtin_names, load_recipe, run_recipe, split_overrides, stage_argv
from posttrain.recipes.checks import check_stages


def stages_of(name: str, arguments: list[str], root):
    recipe = load_recipe(name)
    common, per_stage = split_overrides(recipe, arguments)
    dirs = {stage.name: root / stage.name for stage in recipe.stages}
    return [(stage.name, stage.command, stage_argv(stage, dirs[stage.name], dirs, recipe.overrides + common, per_stage[stage.name]))
            for stage in recipe.stages]


@pytest.mark.parametrize("name", builtin_names())
def test_every_built_in_recipe_passes_its_own_stage_checks(name, tmp_path):
    assert check_stages(stages_of(name, [], tmp_path)) == []


def test_a_late_stage_refused_stops_the_recipe_before_any_stage_runs(tmp_path):
    arguments = ["rl:data.builtin_options.rl_prompt_tokens=700", "rl_eval:trainer.total_trainng_steps=3"]
    with pytest.raises(RecipeError) as info:
        run_recipe("bfcl", arguments, root=tmp_path)
    message = str(info.value)
    assert message.startswith("no stage was run")
    assert "stage 'rl':" in message and "rl_prompt_tokens=700 keeps the rows longer than max_prompt_tokens" in message
    assert "stage 'rl_eval':" in message and "trainer.total_trainng_steps" in message
    assert "stage 'sft'" not in message and "stage 'base_eval'" not in message  # their settings are fine
    assert "the recipe's settings for this stage" in message and "command line)" not in message  # labelled as the recipe's, not a command line
    assert list(tmp_path.iterdir()) == []  # not even the first stage began


def test_a_stage_with_no_preset_is_checked_from_the_preset_its_command_starts_from(tmp_path):
    # `posttrain train` with no --preset starts from arithmetic_grpo, whose dataset has no option digitz
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("description: one stage\nstages:\n  - name: rl\n    command: train\n"
                      "    overrides: [data.builtin_options.digitz=2]\n")
    with pytest.raises(RecipeError, match=r"(?s)stage 'rl':.*unexpected keyword argument 'digitz'"):
        run_recipe(str(recipe), [], root=tmp_path / "run")
    assert not (tmp_path / "run").exists()
