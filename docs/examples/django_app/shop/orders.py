# shop/orders.py
from django.db import connection, transaction

from dispatcher import enqueue_sync
from shop.models import Order


def place_order(email: str, total_cents: int) -> Order:
    with transaction.atomic():
        order = Order.objects.create(email=email, total_cents=total_cents)
        # Django's own psycopg connection, inside the atomic block: the job exists if and only if
        # the order commits (no transaction.on_commit needed, and no job lost if the process dies
        # between the commit and an on_commit hook).
        enqueue_sync(connection.connection, "send_receipt", {"order_id": order.pk})
    return order
