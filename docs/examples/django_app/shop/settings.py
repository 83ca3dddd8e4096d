# shop/settings.py
import os

from psycopg.conninfo import conninfo_to_dict

# One database for your tables and the dispatcher's (`dispatcher migrate`): a job can then commit
# with your rows. DATABASE_URL: postgresql://user:password@host:5432/name, or key=value pairs.
db = conninfo_to_dict(os.environ["DATABASE_URL"])
DATABASES = {
    "default": {
        # psycopg 3 when installed (the dispatcher needs it)
        "ENGINE": "django.db.backends.postgresql",
        "NAME": db.pop("dbname"),
        "USER": db.pop("user", ""),
        "PASSWORD": db.pop("password", ""),
        "HOST": db.pop("host", ""),
        "PORT": db.pop("port", ""),
        "OPTIONS": db,  # whatever else the URL says (sslmode, ...)
        "CONN_MAX_AGE": 60,  # workers' threads keep their connection between jobs...
        "CONN_HEALTH_CHECKS": True,  # ...and check it before reuse
    }
}
INSTALLED_APPS = ["shop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dev only")
