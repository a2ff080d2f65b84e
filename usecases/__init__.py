"""keel's use cases, one package each: a declaration (``usecase``) that keel builds assets, checks, jobs, sensors
and serving from. docs/usecases.md says how to add one."""
