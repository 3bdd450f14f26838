"""The code behind the benchmark scripts, one package per script.

``runs/<script>/`` holds one module per subcommand of ``benchmarks/<script>.py``
(``runs/engine/ttft.py`` is ``python benchmarks/engine.py ttft``) and the pieces its
subcommands share; the script itself is the command line that parses the options and calls them.
"""
