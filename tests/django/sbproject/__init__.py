"""The Django project the Django suite runs: the app, django-celery-beat, the admin."""
