# Sourced by scripts/up and scripts/test: where keel and Dagster keep their state.
export KEEL_HOME="${KEEL_HOME:-$PWD/.keel}"
export DAGSTER_HOME="${DAGSTER_HOME:-$KEEL_HOME/dagster_home}"
mkdir -p "$DAGSTER_HOME"
if [[ ! -f "$DAGSTER_HOME/dagster.yaml" ]]; then
  cat > "$DAGSTER_HOME/dagster.yaml" <<'YAML'
# keel's local Dagster instance: SQLite storage under this directory (the default), no telemetry.
telemetry:
  enabled: false
YAML
fi
