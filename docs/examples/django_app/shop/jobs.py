# shop/jobs.py
"""The project's job handlers. Workers run them beside the web processes, with the same settings:

DISPATCHER_DSN=$DATABASE_URL dispatcher run --app shop.jobs:registry
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
django.setup()  # as manage.py does: the models can be imported from here on

from django.db import close_old_connections  # noqa: E402
from django.utils import timezone  # noqa: E402

from dispatcher import Job, Registry  # noqa: E402
from shop.models import Order  # noqa: E402

registry = Registry()


@registry.handler("send_receipt")
# a plain def: the ORM is synchronous, and this runs in a thread
def send_receipt(job: Job) -> None:
    # what Django does at each request: drop a connection that expired or broke
    close_old_connections()
    order = Order.objects.get(pk=job.payload["order_id"])
    if order.receipt_sent_at is not None:
        return  # sent by an earlier attempt: handlers must be idempotent
    # ... send the receipt to order.email ...
    Order.objects.filter(pk=order.pk).update(receipt_sent_at=timezone.now())
