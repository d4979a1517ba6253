"""Real-browser tier (JupyterLab / Notebook 7 in Debian chromium via Playwright); see README.md."""
