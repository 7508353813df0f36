"""Stage 2: Scenario -> Case -> BuildPlan -> image (resolve, render, cross-install, base images, releases)."""
