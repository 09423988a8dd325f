"""Fuzzing what a user can feed fornax: every parser and loader (:mod:`.loaders`, ``make
fuzz``), and coverage-guided runs of the byte and text loaders through libFuzzer
(:mod:`.atheris_run`, ``make fuzz-atheris``). It drives the whole product (configs, the CLI,
compose and run), so it sits above every other package."""
