"""Evaluators: what turns a batch of input planes into policy logits and values.

The worker (`selfplay`), the arena's players (`arena`), the Beam job's
endstate labeller (`pipeline.labels`) and the trainer's int8 gate
(`model.cpu_int8`) all evaluate through here:

* `inference.devices`: where a process runs its network (CPU, GPU, TPU),
  for the evaluators and the trainer alike;
* `inference.evaluator`: the evaluator protocol, the uniform evaluator
  and the TensorFlow backend (`ModelEvaluator`);
* `inference.openvino_evaluator`: the int8 OpenVINO backend for CPUs and
  `make_evaluator`, the factory that picks a backend for a loaded model;
* `inference.model_files`: a published model's verified local copy
  (`ModelCache`) and its TensorFlow loading (`load_model`);
* `inference.loading`: `load_published_evaluator`, the one path from a
  published model to a probed evaluator, `load_evaluator` (a model root or
  the uniform evaluator) and `PlayoutEvaluator`, generation 0's;
* `inference.eval_cache`: an LRU of outputs for positions seen again;
* `inference.model_probe`: the check that a model's outputs are playable.
"""
