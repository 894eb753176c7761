"""Networks: --network, --subnet and --no-external-ip reach every VM, the TPU VM's
queued request and the Dataflow workers, each with the flag its own tool documents (tests/operations/deploy/test_plan.py
checks every gcloud flag against the installed gcloud's --help; Beam's are checked here against its parser)."""
from __future__ import annotations

import shlex

from tests.operations.deploy.support import BASE, creates, plan_text, run_deploy

PRIVATE = ["--network", "zl-vpc", "--subnet", "zl-sub", "--no-external-ip"]


def test_private_networking_reaches_vms_the_tpu_and_dataflow(capsys):
    script = plan_text(["plan", "--workers", "2", "--trainer-tpu", "v5litepod-8"] + PRIVATE + BASE, capsys)
    vms = creates(script, ("compute", "instances", "create"))
    templates = creates(script, ("compute", "instance-templates", "create"))
    assert len(vms) == 1 and len(templates) == 1          # the follower, and the workers' template
    for words in vms + templates:
        assert {"--network=zl-vpc", "--subnet=zl-sub", "--no-address"} <= set(words), words[3]
    assert "--region=us-central1" in templates[0]         # a global template names its subnet's region
    [tpu] = creates(script, ("compute", "tpus", "queued-resources", "create"))
    assert {"--network=zl-vpc", "--subnetwork=zl-sub", "--internal-ips"} <= set(tpu)

    from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, WorkerOptions
    [follower] = [w for w in vms if w[3] == "zerolake-shuffle"]
    metadata = next(w for w in follower if w.startswith("--metadata=")).removeprefix("--metadata=")
    args = dict(e.split("=", 1) for e in metadata.split(","))["zerolake-args"]
    beam = PipelineOptions(shlex.split(args)[2:])       # past --dataflow-above-positions=N
    workers = beam.view_as(WorkerOptions)
    assert workers.network == "zl-vpc" and workers.subnetwork == "regions/us-central1/subnetworks/zl-sub"
    assert workers.use_public_ips is False and beam.view_as(GoogleCloudOptions).region == "us-central1"


def test_the_defaults_keep_the_default_network_with_external_ips(capsys):
    script = plan_text(["plan", "--workers", "1", "--trainer-tpu", "v5litepod-8"] + BASE, capsys)
    assert not any(flag in script for flag in ("--network", "--subnet", "--no-address", "--internal-ips",
                                               "use_public_ips"))


def test_a_subnet_needs_every_role_in_its_region(capsys):
    code, out, err = run_deploy(["plan", "--workers", "1", "--worker-zone", "us-east1-b", "--trainer-cpu"] + PRIVATE
                                + BASE, capsys)
    [line] = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and out == "" and "--subnet: a subnet lives in one region" in line and "us-east1" in line
    code, _, err = run_deploy(["plan", "--network", "Bad_Name"] + BASE, capsys)
    assert code == 2 and "--network: 'Bad_Name' is not a network or subnet name" in err
