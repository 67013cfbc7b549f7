"""Upstream's pydantic models that the airline tools build from their arguments.

These restate, field for field, the models of tau2-bench's ``domains/airline/data_model.py``
(Sierra Research, MIT licence, kept beside the data in ``data/LICENSE``) that its tools
construct: ``FlightInfo``, ``Passenger`` and ``Payment`` from the agent's arguments, a
``Reservation`` when booking, a ``Certificate`` when sending one. Building the same models
gives the same conversions (an integer amount of a certificate becomes ``100.0``), the same
field order in a dump, and pydantic's own message when an argument does not fit; the names
and descriptions also make the tools' parameter schemas upstream's (``FlightInfo``,
``Passenger`` and ``Payment`` appear in them).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = [
    "CabinClass",
    "Certificate",
    "FlightInfo",
    "FlightType",
    "Insurance",
    "Passenger",
    "Payment",
    "Reservation",
    "ReservationFlight",
]

FlightType = Literal["round_trip", "one_way"]
CabinClass = Literal["business", "economy", "basic_economy"]
Insurance = Literal["yes", "no"]


# FlightInfo, Passenger and Payment appear in the tools' parameter schemas, where pydantic would
# show a docstring as the model's description; upstream's have none, so neither do these.


class FlightInfo(BaseModel):  # a flight of a booking or an update, as the agent names it
    flight_number: str = Field(description="Flight number, such as 'HAT001'.")
    date: str = Field(
        description="The date for the flight in the format 'YYYY-MM-DD', such as '2024-05-01'."
    )


class Passenger(BaseModel):  # a passenger of a reservation
    first_name: str = Field(description="Passenger's first name")
    last_name: str = Field(description="Passenger's last name")
    dob: str = Field(description="Date of birth in YYYY-MM-DD format")


class Payment(BaseModel):  # a payment of a reservation (negative: a refund)
    payment_id: str = Field(description="Unique identifier for the payment")
    amount: int = Field(description="Payment amount in dollars")


class Certificate(BaseModel):
    """A travel certificate among a user's payment methods."""

    source: Literal["certificate"]
    id: str
    amount: float


class ReservationFlight(BaseModel):
    """A flight of a reservation, with the price paid for each passenger."""

    flight_number: str
    origin: str
    destination: str
    date: str
    price: int


class Reservation(BaseModel):
    """A reservation, as a booking creates it."""

    reservation_id: str
    user_id: str
    origin: str
    destination: str
    flight_type: FlightType
    cabin: CabinClass
    flights: list[ReservationFlight]
    passengers: list[Passenger]
    payment_history: list[Payment]
    created_at: str
    total_baggages: int
    nonfree_baggages: int
    insurance: Insurance
    status: Literal["cancelled"] | None = None
