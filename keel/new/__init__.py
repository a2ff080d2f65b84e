"""``keel new``: a use-case package from a table — profile.py reads what the table holds, plan.py (with rules.py and
choices.py) decides every rule, feature and month with its reason, render.py and render_code.py write the files,
scaffold.py reads the file, writes the package and registers its entry point (docs/usecases.md, "Start here")."""
