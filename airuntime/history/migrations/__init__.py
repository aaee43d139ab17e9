"""The durable history's schema migrations (Alembic), shipped inside the package.

Why a package: the wheel carries the migrations next to the code that needs their
head, and ``airt history migrate`` applies them from any install
(``script_location = airuntime.history:migrations``). ``env.py`` is Alembic's entry
point; ``versions/`` holds one module per revision, each frozen once released.
"""
