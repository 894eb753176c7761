"""Deployment on Google Cloud: ``python -m operations.deploy plan | update | down | status``.

Data flow::

    flags --format.cli--> DeployConfig (operations.deploy.config, validated once; zones and TPU runtimes
          from the dated tables of operations.deploy.zones)
          --operations.deploy.plan (update, down)--> Steps --render--> one bash script (printed; run by --apply)
    ROOT  --operations.deploy.status--> one table (generations, games/h, workers, trainer lease)
          (+ with --project: the worker group's VMs against its target, from gcloud)

The VMs the plan creates (the follower, the trainer, and the workers as a
regional managed instance group from an instance template) run
operations/vm/startup.sh, which installs the
package with operations/vm/install.sh (the Dockerfile calls the same script) and
runs each role under systemd (operations/vm/systemd/); Dataflow's workers run
the image operations/dataflow/Dockerfile builds (Cloud Build, in the plan).
docs/deploy.md is the operator's guide.  This package imports
format/ and model/ (status reads the trainer's lease), so it sits in the top
import layer; the rest of cloud/ is the storage layer at the bottom.
"""
