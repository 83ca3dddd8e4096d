# sqlalchemy_enqueue.py
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from dispatcher import enqueue_sync


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(254), unique=True)


def sign_up(session: Session, email: str) -> User:
    """Call it inside the session's transaction: the job commits or rolls back with the user."""
    user = User(email=email)
    session.add(user)
    session.flush()  # the INSERT, now: user.id is known
    conn = session.connection().connection.driver_connection  # the transaction's psycopg connection
    enqueue_sync(conn, "send_welcome", {"user_id": user.id})
    return user
