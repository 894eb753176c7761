"""``python -m operations.deploy``: plan (default), update, down, status; ``--apply`` runs a plan with gcloud.

    python -m operations.deploy plan --project P --root gs://B/run --workers 8 --worker-gpu nvidia-l4 \\
        --trainer-tpu v5litepod-8            # prints the plan
    python -m operations.deploy plan ... --apply  # runs it
    python -m operations.deploy update ... [--release SHA256] [--apply]   # the plan's flags; a new release
    python -m operations.deploy status --root gs://B/run [--project P --region R]   # R: the workers' region
    python -m operations.deploy down --project P --root gs://B/run [--keep-workers K] [--apply]

Entry point only: flags -> DeployConfig -> operations.deploy.plan / update / down / status.  A bad
flag exits 2 naming it; ``--apply`` without a usable gcloud exits 2 naming
what is missing, before anything runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from format.cli import add_config_flags, add_storage_flags, bounded_number, config_from_namespace, storage_retry
from operations.deploy.config import DeployConfig
from operations.deploy.down import build_down_plan
from operations.deploy.plan import build_plan
from operations.deploy.render import render
from operations.deploy.update import build_update_plan
from operations.deploy.workers import worker_group_name


class GcloudUnusable(Exception):
    """gcloud is missing or has no active account; the message names which."""


def check_gcloud(gcloud: str = "gcloud") -> str:
    """The active account of the installed gcloud; GcloudUnusable when there is none."""
    path = shutil.which(gcloud)
    if path is None:
        raise GcloudUnusable(
            f"--apply needs the Google Cloud CLI: `{gcloud}` is not on PATH "
            "(install it: https://cloud.google.com/sdk/docs/install), or paste the plan elsewhere"
        )
    try:
        result = subprocess.run(
            [path, "auth", "list", "--filter=status:ACTIVE", "--format=value(account)"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GcloudUnusable(f"--apply: `{path} auth list` failed: {exc}") from None
    account = result.stdout.strip()
    if result.returncode != 0 or not account:
        raise GcloudUnusable(
            f"--apply: gcloud ({path}) has no active account: run `gcloud auth login` "
            "(and `gcloud auth application-default login` for `status` on gs://)"
        )
    return account


def apply(script: str) -> int:
    """Run the plan's text with bash, its output streaming to ours; bash's exit status."""
    account = check_gcloud()
    print(f"[deploy] applying as {account}", file=sys.stderr, flush=True)
    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="zerolake-plan-", delete=False) as f:
        f.write(script)
    try:
        return subprocess.run(["bash", f.name]).returncode
    finally:
        os.unlink(f.name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m operations.deploy",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command")
    plan = sub.add_parser("plan", help="print the plan that brings the deployment up (the default)")
    add_config_flags(plan, DeployConfig)
    plan.add_argument("--apply", action="store_true", help="run the plan through gcloud instead of printing it")
    update = sub.add_parser(
        "update",
        help="print the plan that moves the running deployment to a new release "
        "(this checkout's, or --release): trainer and follower, then workers",
    )
    add_config_flags(update, DeployConfig, exclude=("only",))
    update.add_argument("--apply", action="store_true", help="run it through gcloud")
    down = sub.add_parser("down", help="print the plan that deletes the VMs; the bucket and its lake stay")
    add_config_flags(down, DeployConfig, exclude=("only",))
    down.add_argument(
        "--keep-workers",
        type=bounded_number(int, at_least=0),
        default=0,
        help="keep worker VMs 0..K-1 and delete the rest (scale down); with --workers-only",
    )
    down.add_argument("--workers-only", action="store_true", help="delete worker VMs only")
    down.add_argument("--delete-account", action="store_true", help="also delete the service account")
    down.add_argument("--apply", action="store_true", help="run it through gcloud")
    status = sub.add_parser("status", help="read the lake and print one table")
    status.add_argument("--root", required=True, help="the lake: gs://BUCKET/RUN or a local folder")
    status.add_argument(
        "--recent-minutes",
        type=bounded_number(float, above=0),
        default=60.0,
        help="what counts as recent for games per hour and workers seen (default: 60)",
    )
    status.add_argument(
        "--sample-chunks",
        type=bounded_number(int, at_least=1),
        default=3,
        help="recent chunks decoded to measure games per byte (default: 3)",
    )
    status.add_argument(
        "--project",
        default="",
        help="also ask gcloud how many VMs the worker group runs against its target size (the deployment's project)",
    )
    status.add_argument(
        "--region", default="us-central1", help="with --project: the worker group's region (default: us-central1)"
    )
    status.add_argument("--name", default="zerolake", help="with --project: the deployment name (default: zerolake)")
    add_storage_flags(status)
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("plan", "update", "down", "status", "-h", "--help"):
        argv.insert(0, "plan")  # plan is the default subcommand
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "status":
        return _status(args, parser)
    config = config_from_namespace(DeployConfig, args, parser)
    if args.command == "plan":
        title = f"bring up deployment {config.name} of {config.root} in {config.project}/{config.zone}"
        script = render(build_plan(config), title)
    elif args.command == "update":
        release = config.release[:12] + "..." if config.release else "this checkout's release"
        title = f"update deployment {config.name} of {config.root} in {config.project} to {release}"
        script = render(build_update_plan(config), title)
    else:
        if args.keep_workers and not args.workers_only:
            parser.error("--keep-workers scales the workers down: give it with --workers-only")
        title = f"take down deployment {config.name} in {config.project} (the bucket {config.bucket} is kept)"
        script = render(
            build_down_plan(
                config,
                keep_workers=args.keep_workers,
                workers_only=args.workers_only,
                delete_account=args.delete_account,
            ),
            title,
        )
    if not args.apply:
        sys.stdout.write(script)
        return 0
    try:
        return apply(script)
    except GcloudUnusable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _status(args, parser) -> int:
    from cloud.base import StorageError
    from cloud.storage import open_storage
    from format.registry import RegistryError
    from model.lease import LeaseError
    from operations.deploy.status import read_status, table, worker_group_text

    try:
        storage = open_storage(args.root, retry=storage_retry(args, parser))
        print(table(read_status(storage, recent_minutes=args.recent_minutes, sample_chunks=args.sample_chunks)))
        if args.project:
            group = worker_group_name(args.name)
            print(f"worker group {group} ({args.region})  {worker_group_text(args.project, group, args.region)}")
    except ValueError as exc:
        parser.error(f"--root: {exc}")
    except (StorageError, LeaseError, RegistryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
