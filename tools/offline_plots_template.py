"""Write `.dvc/plots/offline.html`: DVC's plots page with vega, vega-lite and vega-embed inlined.

`dvc plots show` loads these libraries from a CDN by default, so its HTML renders nothing
offline. This fetches the same versions from the npm registry (`npm pack`) and inlines them,
each after its licence (BSD-3-Clause) as a comment; `.dvc/config` points `plots.html_template`
at the result. The page is committed (vendored), so every checkout has it; this tool is how it
was made, and how to make it again for other versions:

    python tools/offline_plots_template.py [--force]
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGES = {"vega": ("5.20.2", "build/vega.min.js"), "vega-lite": ("5.2.0", "build/vega-lite.min.js"),
            "vega-embed": ("6.18.2", "build/vega-embed.min.js")}
TARGET = Path(__file__).resolve().parents[1] / ".dvc" / "plots" / "offline.html"

PAGE = """<!DOCTYPE html>
<html>
<head>
    {{refresh_tag}}
    <meta charset="utf-8">
    <title>DVC Plot</title>
{scripts}
    <style>
        table {{ border-spacing: 15px; }}
    </style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""


def main(argv: list[str] | None = None) -> int:
    if TARGET.exists() and "--force" not in (sys.argv[1:] if argv is None else argv):
        print(f"{TARGET} exists (--force to write it again)")
        return 0
    scripts = []
    with tempfile.TemporaryDirectory() as workdir:
        for name, (version, member) in PACKAGES.items():
            packed = subprocess.run(["npm", "pack", "--silent", f"{name}@{version}"], cwd=workdir,
                                    capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            with tarfile.open(Path(workdir) / packed) as archive:
                source = archive.extractfile(f"package/{member}").read().decode("utf-8")
                licence = archive.extractfile("package/LICENSE").read().decode("utf-8").replace("-->", "- ->")
            inline = source.replace("</script", "<\\/script")
            scripts.append(f"    <!-- {name} {version} (npm), {member}\n{licence.strip()}\n    -->\n"
                           f"    <script>\n{inline}\n    </script>")
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    temporary = TARGET.with_suffix(".tmp")
    temporary.write_text(PAGE.format(scripts="\n".join(scripts)), encoding="utf-8")
    temporary.replace(TARGET)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
