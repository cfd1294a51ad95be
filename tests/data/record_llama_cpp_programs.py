"""Record what each program of ``tests/llama_cpp_programs/`` prints under
llama-cpp-python itself, on the shipped SmolLM2 file, into
``tests/data/llama_cpp_programs.json`` (``tests/llm/test_llama_cpp_programs.py`` runs the
same programs with only the import changed and compares).

Run with an interpreter that has llama-cpp-python 0.3.36 (its README's CPU build):
``~/peers/bin/python tests/data/record_llama_cpp_programs.py MODEL.gguf``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
PROGRAMS = HERE.parent / "llama_cpp_programs"


def main() -> None:
    model = sys.argv[1]
    import llama_cpp

    out = {"llama_cpp_python": llama_cpp.__version__, "model": Path(model).name, "outputs": {}}
    for program in sorted(PROGRAMS.glob("*.py")):
        env = {**os.environ, "MODEL": model}
        run = subprocess.run(
            [sys.executable, str(program)], env=env, capture_output=True, text=True, check=True
        )
        out["outputs"][program.stem] = json.loads(run.stdout.strip().splitlines()[-1])
        print(program.stem, "recorded")
    (HERE / "llama_cpp_programs.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
