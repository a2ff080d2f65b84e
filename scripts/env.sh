# Sourced by scripts/up and scripts/test: where keel and Dagster keep their state.
export KEEL_HOME="${KEEL_HOME:-$PWD/.keel}"
export DAGSTER_HOME="${DAGSTER_HOME:-$KEEL_HOME/dagster_home}"
mkdir -p "$DAGSTER_HOME"
# The instance's settings (scripts/dagster.yaml), unless this home already has its own.
[[ -f "$DAGSTER_HOME/dagster.yaml" ]] || cp "$(dirname "${BASH_SOURCE[0]}")/dagster.yaml" "$DAGSTER_HOME/dagster.yaml"
