"""One evaluator interface (inference.evaluator.Evaluator) with one return shape."""
import numpy as np
import pytest

from inference.evaluator import Evaluator, UniformEvaluator
from inference.loading import PlayoutEvaluator
from arena.player import call_evaluator


def planes(batch, n=9):
    out = np.zeros((batch, n, n, 17), np.float32)
    out[..., 16] = 1.0
    return out


@pytest.mark.parametrize("evaluator", [UniformEvaluator(9), PlayoutEvaluator(9, 7.5, playouts=2, seed=1)])
def test_the_evaluators_share_one_interface_and_return_shape(evaluator):
    assert isinstance(evaluator, Evaluator)
    out = evaluator(planes(3))
    assert isinstance(out, tuple) and len(out) == 2
    logits, values = call_evaluator(evaluator, planes(3))
    assert logits.shape == (3, 82) and values.shape == (3,) and isinstance(evaluator.generation, int)


def test_a_model_that_returns_every_head_must_be_wrapped():
    def raw_model(x):
        return {"policy_logits": np.zeros((len(x), 82), np.float32), "value": np.zeros(len(x), np.float32)}

    raw_model.generation = 1
    with pytest.raises(TypeError, match="ModelEvaluator"):
        call_evaluator(raw_model, planes(2))
