"""Operations: running the roles, on one machine or many.

The top floor: it starts the worker, the shuffle job and the trainer as
processes and checks what they did, but computes nothing itself.

* `operations.loop`: ``python -m operations.loop``, the one-machine loop
  (the quick start's main job, and the long-run mode);
* `operations.cluster`: ``python -m operations.cluster``, every role at
  once on one root, with a chaos mode; `operations.chaos_audit` checks the
  lake against what the roles reported;
* `operations.roles`: how a launcher holds each role's config and builds
  each child's command line;
* `operations.deploy`: ``python -m operations.deploy``, the Google Cloud
  planner; ``operations/vm/`` the VM scripts and systemd units it installs;
  ``operations/dataflow/`` the shuffle job's Dataflow worker image.
"""
