# Sourced by scripts/up and scripts/test: where keel and Dagster keep their state.
export KEEL_HOME="${KEEL_HOME:-$PWD/.keel}"
export DAGSTER_HOME="${DAGSTER_HOME:-$KEEL_HOME/dagster_home}"
mkdir -p "$DAGSTER_HOME"
# The instance's settings, unless this home already has its own: SQLite files under DAGSTER_HOME (scripts/dagster.yaml,
# the default), or PostgreSQL when KEEL_DAGSTER_POSTGRES_URL names a database (scripts/dagster-postgres.yaml).
_keel_scripts="$(dirname "${BASH_SOURCE[0]}")"
if [[ -n "${KEEL_DAGSTER_POSTGRES_URL:-}" ]]; then _keel_instance=dagster-postgres.yaml; else _keel_instance=dagster.yaml; fi
if [[ ! -f "$DAGSTER_HOME/dagster.yaml" ]]; then
  cp "$_keel_scripts/$_keel_instance" "$DAGSTER_HOME/dagster.yaml"
elif [[ -n "${KEEL_DAGSTER_POSTGRES_URL:-}" ]] && ! grep -q "KEEL_DAGSTER_POSTGRES_URL" "$DAGSTER_HOME/dagster.yaml"; then
  echo "keel: KEEL_DAGSTER_POSTGRES_URL is set but $DAGSTER_HOME/dagster.yaml keeps this home's own storage" >&2
fi
unset _keel_scripts _keel_instance
