# zerolake in a container (GKE and other container platforms), CPU or GPU:
#
#   docker build -t zerolake .                             # CPU (tensorflow-cpu)
#   docker build -t zerolake-gpu --build-arg ACCELERATOR=gpu .   # NVIDIA GPU (tensorflow[and-cuda])
#   docker run -e ZEROLAKE_ROOT=gs://BUCKET/RUN zerolake worker 0
#   docker run -e ZEROLAKE_ROOT=gs://BUCKET/RUN zerolake shuffle
#   docker run -e ZEROLAKE_ROOT=gs://BUCKET/RUN -e ZEROLAKE_ARGS="--visits 128" zerolake trainer
#
# The image installs with cloud/vm/install.sh, the same script the VMs' start-up
# script runs, and starts roles with cloud/vm/run-role.sh, as the VMs' systemd
# units do.  CUDA and cuDNN come with the GPU build's pip packages, so one base
# image serves both; the host needs the NVIDIA driver and container toolkit.
# Not built on the machine this was written on: no container engine runs there.
FROM python:3.11-slim-bookworm
ARG ACCELERATOR=cpu
ENV ZEROLAKE_ACCELERATOR=${ACCELERATOR} \
    ZEROLAKE_PREFIX=/opt/zerolake \
    ZEROLAKE_STATE=/var/lib/zerolake \
    PYTHONDONTWRITEBYTECODE=1
COPY . /opt/zerolake/src
# python:3.11 images keep their interpreter in /usr/local; install.sh's apt step
# adds the compiler and headers the Cython extensions need.
RUN PYTHON=/usr/local/bin/python3 /opt/zerolake/src/cloud/vm/install.sh \
        --accelerator "${ACCELERATOR}" --package /opt/zerolake/src --prefix /opt/zerolake \
    && rm -rf /root/.cache/pip /var/lib/apt/lists/*
WORKDIR /var/lib/zerolake
# exec form: the role is PID 1's only child chain, so `docker stop`'s SIGTERM
# reaches it and it flushes (worker spool, trainer checkpoint) before exiting.
ENTRYPOINT ["/opt/zerolake/src/cloud/vm/run-role.sh"]
CMD ["worker", "0"]
