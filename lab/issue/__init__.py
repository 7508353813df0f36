"""From an upstream issue to a scenario: fetch the page (`fetch`), split it into sections and code
blocks (`parse`), infer the case with the page line each fact came from (`infer`), and write the
scenario YAML and its script with every fix-up recorded (`write`). `triage` chains a run on the
page's version, a run on the newest release, a bisection and the comparison.

Nothing from the page ever runs on the host: the script only runs in the lab's confined container.
"""
