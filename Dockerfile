# zerolake in a container, CPU or GPU:
#
#   docker build -t zerolake .                                    # CPU (tensorflow-cpu)
#   docker build -t zerolake-gpu --build-arg ACCELERATOR=gpu .    # NVIDIA GPU (tensorflow[and-cuda])
#   docker run -v zerolake-state:/var/lib/zerolake -e ZEROLAKE_ROOT=gs://BUCKET/RUN zerolake worker 0
#   docker run -v zerolake-state:/var/lib/zerolake -e ZEROLAKE_ROOT=gs://BUCKET/RUN zerolake shuffle
#   docker run -v zerolake-state:/var/lib/zerolake -e ZEROLAKE_ROOT=gs://BUCKET/RUN \
#       -e ZEROLAKE_ARGS="--batch-size 512" zerolake trainer
#
# Two stages.  `build` installs with operations/vm/install.sh, the same script the
# VMs' start-up script runs: Debian's compiler and headers, the Cython build,
# pinned versions (operations/vm/constraints.txt) into /opt/zerolake/venv.  The
# final stage starts again from the same slim Python base (the venv's
# interpreter, /usr/local/bin/python3, is at the same path) and takes only the
# venv and the source tree: no compiler, no apt lists, no pip cache.  Roles run
# as the unprivileged user `zerolake`, through operations/vm/run-role.sh as the VMs'
# systemd units do.  /var/lib/zerolake (a worker's spool, model caches, the
# trainer's stage folder) is a volume, so a worker's spool outlives its
# container as it outlives a spot VM's preemption on the boot disk.  CUDA and
# cuDNN come with the GPU build's pip packages; the host needs the NVIDIA
# driver and container toolkit.  Google Cloud deployments use VMs
# (python -m operations.deploy); no orchestrator's manifests are shipped.
FROM python:3.11-slim-bookworm AS build
ARG ACCELERATOR=cpu
COPY . /opt/zerolake/src
RUN PYTHON=/usr/local/bin/python3 /opt/zerolake/src/operations/vm/install.sh \
        --accelerator "${ACCELERATOR}" --package /opt/zerolake/src --prefix /opt/zerolake \
    && rm -rf /root/.cache/pip

FROM python:3.11-slim-bookworm
ARG ACCELERATOR=cpu
ENV ZEROLAKE_ACCELERATOR=${ACCELERATOR} \
    ZEROLAKE_PREFIX=/opt/zerolake \
    ZEROLAKE_STATE=/var/lib/zerolake \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/zerolake /opt/zerolake
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/zerolake --create-home zerolake
# The user zerolake by its number: a host can read a numeric uid without the
# image's /etc/passwd, and Docker still takes the group and HOME from that
# file's entry for 10001, as it would for the name.
USER 10001
WORKDIR /var/lib/zerolake
VOLUME /var/lib/zerolake
# exec form: the role is PID 1's only child chain, so `docker stop`'s SIGTERM
# reaches it and it flushes (worker spool, trainer checkpoint) before exiting.
ENTRYPOINT ["/opt/zerolake/src/operations/vm/run-role.sh"]
CMD ["worker", "0"]
