"""Deployment on Google Cloud: ``python -m cloud.deploy plan | down | status``.

Data flow::

    flags --format.cli--> DeployConfig (cloud.deploy.config, validated once; zones and TPU runtimes
          from the dated tables of cloud.deploy.zones)
          --cloud.deploy.plan--> Steps --render--> one bash script (printed; run by --apply)
    ROOT  --cloud.deploy.status--> one table (generations, games/h, workers, trainer lease)

The VMs the plan creates run cloud/vm/startup.sh, which installs the
package with cloud/vm/install.sh (the Dockerfile calls the same script) and
runs each role under systemd (cloud/vm/systemd/); Dataflow's workers run
the image cloud/dataflow/Dockerfile builds (Cloud Build, in the plan).
docs/deploy.md is the operator's guide.  This package imports
format/ and model/ (status reads the trainer's lease), so it sits in the top
import layer; the rest of cloud/ is the storage layer at the bottom.
"""
