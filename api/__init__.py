"""HTTP API: routers, schemas, error mapping; api/routes.py:install_routes wires it into an app.

Imports nothing: a light module of the package (quotas.py, auth.py) is imported without
loading FastAPI and every router, which `eventlog` commands other than serve never use."""
