"""The older record versions: what reads them (readers only; their writers are in testdata).

Production writes version-4 position records (format.position_records,
format.group_wire).  Windows written by an earlier release hold version 1:
one assembled position a record.  Reading version 1 lives here (or, for
TensorFlow, beside the trainer), so the production modules hold no branch of
their own for it:

* `format.legacy.version1`: its field decoding, numpy only (its writers,
  for tests and bench/train.py, are `testdata.records_v1`);
* its tf.data decoder is `model.tfdata_version1`, in the trainer's package
  with the rest of the TensorFlow input pipeline (`format` imports no
  TensorFlow).

`format.position_records.decode_records` and `model.tfdata.training_dataset`
pick the version from a record and hand version 1 to these modules.
Version 2 is version 3 with two more columns (each position's ownership and
generation, which version 3 keeps in the window's game table), and version 3
is version 4 with a narrower policy value (1..255, every entry raised to at
least 1, where version 4 keeps the target the worker recorded): the group
decoders read both where they read those columns (`schema.policy_value_max`
gives each version's range), since a copy of the group decoder would be the
larger legacy.
"""
