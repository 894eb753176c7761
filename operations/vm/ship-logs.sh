#!/usr/bin/env bash
# Ship this VM's zerolake logs to Cloud Logging with Google's Ops Agent:
# what zerolake-logging.service runs (installed and started by
# operations/vm/startup.sh unless the instance metadata says zerolake-logging=off).
#
#   ship-logs.sh on    # the zerolake units and the start-up script only (the default)
#   ship-logs.sh all   # the whole systemd journal
#
# 1. Installs the Ops Agent if it is missing (Google's repository script).
#    One try here: a failure exits 1, and the unit (Restart=on-failure)
#    runs this again 2 minutes later, until it succeeds, while the roles run.
# 2. Writes the agent's configuration (one systemd_journald receiver) and
#    restarts the agent.  The roles print one JSON event a line (format/events.py:
#    schema, role, event, generation, ...); the parse_json processor turns
#    each such line's MESSAGE into fields, so Cloud Logging can filter on
#    jsonPayload.role, jsonPayload.event, jsonPayload.generation (lines that are
#    not JSON stay text).  With `on`, entries of other units are excluded
#    before they leave the VM; the agent's built-in syslog pipeline is off in
#    both modes (the journal already holds what it would send twice).
#
# ZEROLAKE_OPS_AGENT_DIR moves /etc/google-cloud-ops-agent (the tests write
# the configuration elsewhere).  docs/deploy.md, "Logs", has the queries.
set -euo pipefail
MODE="${1:-on}"
CONFIG_DIR="${ZEROLAKE_OPS_AGENT_DIR:-/etc/google-cloud-ops-agent}"
case "$MODE" in
    on|all) ;;
    *) echo "ship-logs.sh: the mode must be on or all, not '$MODE' (metadata zerolake-logging)" >&2; exit 2 ;;
esac

log() { echo "[zerolake-logging] $*"; }

if ! systemctl cat google-cloud-ops-agent.service >/dev/null 2>&1; then
    log "installing the Ops Agent (logs to Cloud Logging)"
    work=$(mktemp -d)
    if ! (cd "$work" && curl -fsSO https://dl.google.com/cloudagents/add-google-cloud-ops-agent-repo.sh \
            && bash add-google-cloud-ops-agent-repo.sh --also-install); then
        rm -rf "$work"
        log "the Ops Agent did not install (see above); zerolake-logging.service tries again in 2 minutes." \
            "Meanwhile this VM's log stays in its journal: journalctl -u 'zerolake-*'"
        exit 1
    fi
    rm -rf "$work"
fi

if [[ "$MODE" == on ]]; then
    processors="[zerolake_units_only, zerolake_events]"
else
    processors="[zerolake_events]"
fi
mkdir -p "$CONFIG_DIR"
cat > "$CONFIG_DIR/config.yaml.new" <<YAML
# Written by zerolake (operations/vm/ship-logs.sh $MODE).
logging:
  receivers:
    zerolake_journal:
      type: systemd_journald
  processors:
    zerolake_units_only:
      type: exclude_logs
      match_any:
      - 'NOT (jsonPayload._SYSTEMD_UNIT =~ "^zerolake-" OR jsonPayload._SYSTEMD_UNIT = "google-startup-scripts.service")'
    zerolake_events:
      type: parse_json
      field: MESSAGE
  service:
    pipelines:
      default_pipeline:
        receivers: []
      zerolake:
        receivers: [zerolake_journal]
        processors: $processors
YAML
mv "$CONFIG_DIR/config.yaml.new" "$CONFIG_DIR/config.yaml"
if ! systemctl restart google-cloud-ops-agent; then
    log "the Ops Agent did not restart; zerolake-logging.service tries again in 2 minutes"
    exit 1
fi
log "shipping the journal ($MODE) to Cloud Logging, log zerolake_journal"
