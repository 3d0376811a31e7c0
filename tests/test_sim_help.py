NUM_GPUS = 0
"""`dynarl sim --help` says what each policy is, which devices --device takes, what the
table's columns mean and that the cost model is not calibrated on a GPU; the default
measures more than one iteration."""

import pytest

from dynarl.components.costmodel import DEVICES
from dynarl.components.placement.policy import REGISTRY, describe
from dynarl.launch.sim.cli import COLUMNS, DEFAULT_ITERATIONS, parser


@pytest.fixture(scope="module")
def text():
    return " ".join(parser().format_help().split())  # whitespace as one space: wrapped lines join


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_each_policy_is_described(text, name):
    summary = describe(name)
    assert summary and f"{name} {summary}" in text


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_the_device_choices_are_listed(text, device):
    assert f"{device} " in text
    assert "--device DEVICE the emulated device the cost model prices: cpu-tiny, h100-80gb, h200" in text


@pytest.mark.parametrize("column", [name for name, _ in COLUMNS])
def test_each_column_is_explained(text, column):
    meaning = dict(COLUMNS)[column]
    assert f"{column} {' '.join(meaning.split())}" in text


def test_it_says_the_cost_model_is_not_calibrated_and_ends_without_an_ellipsis(text):
    assert "not yet calibrated on a GPU" in text
    assert ", ..." not in text and not text.rstrip().endswith("...")  # (the policies' list ended so)


def test_an_unknown_device_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--device", "a100"])
    assert "choose from 'cpu-tiny', 'h100-80gb', 'h200'" in capsys.readouterr().err


def test_the_default_measures_several_iterations():
    args = parser().parse_args([])
    assert args.iterations is None and DEFAULT_ITERATIONS - args.warmup >= 2


def test_a_registered_policy_without_a_summary_is_described_by_its_docstring():
    class Mine:
        """Mine: a test policy.

        More."""
    REGISTRY["test-mine"] = Mine
    try:
        assert describe("test-mine") == "Mine: a test policy."
    finally:
        del REGISTRY["test-mine"]
