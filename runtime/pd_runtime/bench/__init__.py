"""`pdctl bench`: an open-loop goodput benchmark against any OpenAI-compatible endpoint.

Pure core (statistics, SLO judgement, search, result documents) is kept apart from the shell
(aiohttp client, progress bar, CLI, plots), so every figure the bench reports is unit-tested on plain
data. Definitions and the JSON schema are documented in docs/goodput.md.
"""
