"""The tau2-bench airline tools, plain (non-transactional in the harness sense), on SQLite.

Each public method of :class:`AirlineTools` is one upstream tool, with upstream's name, argument
names and types, and behaviour: the same validations in the same order, the same error
messages, the same mutations and the same return values (records in the shape of upstream's
``model_dump()``, optional fields included as ``None``). The one deliberate difference is
atomicity: every write tool runs in a single SQLite transaction, so a tool that fails leaves the
database exactly as it was (upstream mutates its in-memory models as it goes).

Upstream behaviours a wrapper must respect (they are reproduced, not fixed):

- ``book_reservation`` takes the first free id of ``HATHAT``, ``HATHAU``, ``HATHAV``, dates the
  reservation ``2024-05-15T15:00:00``, checks each flight's seats for all passengers without
  counting the other legs, and consumes a certificate whole (it is removed) while a gift card
  loses the amount paid (a float: ``100.0 - 56`` is ``44.0``).
- ``cancel_reservation`` appends a negative payment for every payment (refunds of refunds when
  cancelled twice), moves no money and releases no seat.
- ``update_reservation_flights`` keeps a flight's old price when flight, date and cabin are
  unchanged, charges (or, negative, refunds to a gift card) the difference, and takes no seat.
- ``send_certificate`` gives the first free of ``certificate_3221322``, ``..323``, ``..324``.

Arguments that upstream turns into its models (flights, passengers, payments, a reservation, a
certificate) go through the same pydantic models (:mod:`harness.domains.airline.models`), so a
malformed one fails with pydantic's own message, as upstream's does.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from pydantic import BaseModel

from harness.domains.airline.db import DATABASE, Record, reservation_flight
from harness.domains.airline.models import (
    CabinClass,
    Certificate,
    FlightInfo,
    FlightType,
    Insurance,
    Passenger,
    Payment,
    Reservation,
)
from harness.domains.records import writing
from harness.domains.tau2 import Tau2Tools, UpstreamError, upstream_error

__all__ = [
    "AIRPORTS",
    "NOW",
    "READ_TOOLS",
    "TOOL_TYPES",
    "WRITE_TOOLS",
    "AirlineError",
    "AirlineTools",
    "new_certificate_ids",
    "new_reservation_ids",
    "upstream_error",
]


class AirlineError(UpstreamError):
    """An airline tool refused the call; ``str(error)`` is upstream's message for the agent."""


TOOL_TYPES: Final[Mapping[str, str]] = {
    "book_reservation": "write",
    "calculate": "generic",
    "cancel_reservation": "write",
    "get_reservation_details": "read",
    "get_user_details": "read",
    "list_all_airports": "read",
    "search_direct_flight": "read",
    "search_onestop_flight": "read",
    "send_certificate": "write",
    "transfer_to_human_agents": "generic",
    "update_reservation_baggages": "write",
    "update_reservation_flights": "write",
    "update_reservation_passengers": "write",
    "get_flight_status": "read",
}
"""Every airline tool with upstream's ``ToolType`` (``read``, ``write`` or ``generic``)."""

WRITE_TOOLS: Final[tuple[str, ...]] = tuple(n for n, t in TOOL_TYPES.items() if t == "write")
"""The tools that change the database (each in one transaction)."""

READ_TOOLS: Final[tuple[str, ...]] = tuple(n for n, t in TOOL_TYPES.items() if t != "write")
"""The tools that never write: upstream's read tools and its two generic ones."""

new_reservation_ids: Final = ("HATHAT", "HATHAU", "HATHAV")
"""The ids a booking takes, the first one free (upstream assumes at most three a task)."""

new_certificate_ids: Final = tuple(f"certificate_{n}" for n in (3221322, 3221323, 3221324))
"""The ids a certificate takes, the first one free in the user's payment methods."""

NOW: Final = "2024-05-15T15:00:00"
"""Upstream's current time: every booking is created at it."""

AIRPORTS: Final[tuple[tuple[str, str], ...]] = (
    ("SFO", "San Francisco"),
    ("JFK", "New York"),
    ("LAX", "Los Angeles"),
    ("ORD", "Chicago"),
    ("DFW", "Dallas"),
    ("DEN", "Denver"),
    ("SEA", "Seattle"),
    ("ATL", "Atlanta"),
    ("MIA", "Miami"),
    ("BOS", "Boston"),
    ("PHX", "Phoenix"),
    ("IAH", "Houston"),
    ("LAS", "Las Vegas"),
    ("MCO", "Orlando"),
    ("EWR", "Newark"),
    ("CLT", "Charlotte"),
    ("MSP", "Minneapolis"),
    ("DTW", "Detroit"),
    ("PHL", "Philadelphia"),
    ("LGA", "LaGuardia"),
)
"""``list_all_airports``: IATA code and city, in upstream's order."""

_STORED_CREDIT: Final = frozenset({"gift_card", "certificate"})


def as_sent(values: Any) -> Any:
    """A list of arguments as the agent sent them: models (what the harness's validation made
    of a dict) back to dicts, so the tool takes upstream's path for a list of dicts."""
    if not isinstance(values, list):
        return values
    return [v.model_dump() if isinstance(v, BaseModel) else v for v in values]


def _models(values: Any, model: type[BaseModel]) -> Any:
    """Upstream's conversion: a list of dicts becomes models (pydantic's errors if one does
    not fit); anything else is left as it is."""
    values = as_sent(values)
    if all(isinstance(v, dict) for v in values):
        return [model(**v) for v in values]
    return values


class AirlineTools(Tau2Tools):
    """All the tools of the airline domain, over one SQLite connection (with the generic
    ``calculate`` and ``transfer_to_human_agents`` of :class:`Tau2Tools`, which says what
    connection it takes)."""

    TOOL_TYPES: ClassVar[Mapping[str, str]] = TOOL_TYPES
    ERROR: ClassVar[type[UpstreamError]] = AirlineError

    # -- storage and upstream's private helpers (same messages) ----------------------------------

    def _put(self, table: str, record: Record) -> None:
        DATABASE.put(self.conn, table, record)

    def _get_user(self, user_id: str) -> Record:
        user = DATABASE.fetch(self.conn, "users", user_id)
        if user is None:
            raise AirlineError(f"User {user_id} not found")
        return user

    def _get_reservation(self, reservation_id: str) -> Record:
        reservation = DATABASE.fetch(self.conn, "reservations", reservation_id)
        if reservation is None:
            raise AirlineError(f"Reservation {reservation_id} not found")
        return reservation

    def _get_flight(self, flight_number: str) -> Record:
        flight = DATABASE.fetch(self.conn, "flights", flight_number)
        if flight is None:
            raise AirlineError(f"Flight {flight_number} not found")
        return flight

    @staticmethod
    def _instance(flight: Record, date: str) -> Record:
        """The flight's status on ``date`` (upstream's ``_get_flight_instance``, flight found)."""
        if date not in flight["dates"]:
            raise AirlineError(f"Flight {flight['flight_number']} not found on date {date}")
        instance: Record = flight["dates"][date]
        return instance

    def _bookable(self, flight: Record, date: str, cabin: str, seats: int) -> Record:
        """The flight's status on ``date``, available with ``seats`` seats in ``cabin``."""
        instance = self._instance(flight, date)
        number = flight["flight_number"]
        if instance["status"] != "available":
            raise AirlineError(f"Flight {number} not available on date {date}")
        if instance["available_seats"][cabin] < seats:
            raise AirlineError(f"Not enough seats on flight {number}")
        return instance

    def _new_reservation_id(self) -> str:
        for reservation_id in new_reservation_ids:
            if DATABASE.fetch(self.conn, "reservations", reservation_id) is None:
                return reservation_id
        raise AirlineError("Too many reservations")

    def _direct_flights(
        self,
        date: str,
        origin: str | None = None,
        destination: str | None = None,
        leave_after: str | None = None,
    ) -> list[Record]:
        """Upstream's ``_search_direct_flight``: available flights on ``date``, in db order."""
        results = []
        rows = self.conn.execute(
            "SELECT flight_number, origin, destination, scheduled_departure_time_est, "
            "scheduled_arrival_time_est, dates FROM flights ORDER BY rowid"
        )
        for number, start, end, departure, arrival, dates in rows:
            if origin is not None and start != origin:
                continue
            if destination is not None and end != destination:
                continue
            if leave_after is not None and not departure >= leave_after:
                continue
            on_date = json.loads(dates).get(date)
            if on_date is None or on_date["status"] != "available":
                continue
            results.append(
                {
                    "flight_number": number,
                    "origin": start,
                    "destination": end,
                    "status": "available",
                    "scheduled_departure_time_est": departure,
                    "scheduled_arrival_time_est": arrival,
                    "date": None,
                    "available_seats": on_date["available_seats"],
                    "prices": on_date["prices"],
                }
            )
        return results

    def _payment_for_update(self, user: Record, payment_id: str, total_price: int) -> Record | None:
        """Upstream's payment for an update: checks the method, takes a gift card's share, and
        returns the payment to record (None when the price is 0). ``user`` is changed in place;
        the caller writes it."""
        methods: dict[str, Record] = user["payment_methods"]
        if payment_id not in methods:
            raise AirlineError("Payment method not found")
        method = methods[payment_id]
        if method["source"] == "certificate":
            raise AirlineError("Certificate cannot be used to update reservation")
        if method["source"] == "gift_card" and method["amount"] < total_price:
            raise AirlineError("Gift card balance is not enough")
        if method["source"] == "gift_card":
            method["amount"] -= total_price
        if total_price == 0:
            return None
        return Payment(payment_id=payment_id, amount=total_price).model_dump()

    def _pay_update(self, reservation: Record, payment_id: str, total_price: int) -> None:
        """Pay ``total_price`` for an update of ``reservation`` with ``payment_id``: record the
        payment and write the gift card's new balance."""
        user = self._get_user(reservation["user_id"])
        payment = self._payment_for_update(user, payment_id, total_price)
        if payment is not None:
            reservation["payment_history"].append(payment)
            if user["payment_methods"][payment_id]["source"] == "gift_card":
                self._put("users", user)

    # -- read tools ------------------------------------------------------------------------------

    def get_reservation_details(self, reservation_id: str) -> Record:
        """Get the details of a reservation.

        Args:
            reservation_id: The reservation id, such as '8JX2WO'.

        Returns:
            The reservation.

        Raises:
            AirlineError: If the reservation is not found.
        """
        return self._get_reservation(reservation_id)

    def get_user_details(self, user_id: str) -> Record:
        """Get the details of a user, including their reservations.

        Args:
            user_id: The user id, such as 'sara_doe_496'.

        Returns:
            The user.

        Raises:
            AirlineError: If the user is not found.
        """
        return self._get_user(user_id)

    def list_all_airports(self) -> list[Record]:
        """List every airport: its IATA code and city.

        Returns:
            ``[{"iata": ..., "city": ...}]`` in upstream's order.
        """
        return [{"iata": iata, "city": city} for iata, city in AIRPORTS]

    def search_direct_flight(self, origin: str, destination: str, date: str) -> list[Record]:
        """Search for direct flights between two cities on a date.

        Args:
            origin: The origin airport in three letters, such as 'JFK'.
            destination: The destination airport in three letters, such as 'LAX'.
            date: The date, 'YYYY-MM-DD', such as '2024-01-01'.

        Returns:
            The flights available that day, with their seats and prices.
        """
        return self._direct_flights(date=date, origin=origin, destination=destination)

    def search_onestop_flight(self, origin: str, destination: str, date: str) -> list[list[Record]]:
        """Search for one-stop flights between two cities on a date.

        The second leg leaves the same day after the first lands (the next day when the first
        lands after midnight, as upstream computes it: ``2024-05-<day + 1>``).

        Args:
            origin: The origin airport in three letters, such as 'JFK'.
            destination: The destination airport in three letters, such as 'LAX'.
            date: The date, 'YYYY-MM-DD', such as '2024-05-01'.

        Returns:
            Pairs of flights ``[first, second]``, each with its date.
        """
        results = []
        for first in self._direct_flights(date=date, origin=origin):
            first["date"] = date
            arrival = first["scheduled_arrival_time_est"]
            date2 = f"2024-05-{int(date[-2:]) + 1}" if "+1" in arrival else date
            for second in self._direct_flights(
                date=date2,
                origin=first["destination"],
                destination=destination,
                leave_after=arrival,
            ):
                second["date"] = date2
                results.append([first, second])
        return results

    def get_flight_status(self, flight_number: str, date: str) -> str:
        """Get the status of a flight on a date.

        Args:
            flight_number: The flight number, such as 'HAT001'.
            date: The date, 'YYYY-MM-DD'.

        Returns:
            The status: 'available', 'on time', 'delayed', 'flying', 'landed' or 'cancelled'.

        Raises:
            AirlineError: If the flight is not found, or not on that date.
        """
        status: str = self._instance(self._get_flight(flight_number), date)["status"]
        return status

    # -- write tools -----------------------------------------------------------------------------

    def book_reservation(
        self,
        user_id: str,
        origin: str,
        destination: str,
        flight_type: FlightType,
        cabin: CabinClass,
        flights: list[FlightInfo | dict[str, Any]],
        passengers: list[Passenger | dict[str, Any]],
        payment_methods: list[Payment | dict[str, Any]],
        total_baggages: int,
        nonfree_baggages: int,
        insurance: Insurance,
    ) -> Record:
        """Book a reservation.

        The price is each flight's price in the cabin for every passenger, $30 a passenger for
        insurance and $50 a non-free bag; the payments must add up to it exactly. Gift cards
        pay from their balance, a certificate is used up whole.

        Args:
            user_id: The user who books, such as 'sara_doe_496'.
            origin: The trip's origin airport, such as 'SFO'.
            destination: The trip's destination airport, such as 'JFK'.
            flight_type: 'one_way' or 'round_trip'.
            cabin: 'basic_economy', 'economy' or 'business'.
            flights: Each flight: ``{"flight_number", "date"}``.
            passengers: Each passenger: ``{"first_name", "last_name", "dob"}``.
            payment_methods: Each payment: ``{"payment_id", "amount"}``.
            total_baggages: The number of bags.
            nonfree_baggages: The number of bags to pay for.
            insurance: 'yes' or 'no'.

        Returns:
            The new reservation.

        Raises:
            AirlineError: If the user, a flight or a payment method is not found, a flight is
                not available that day or has too few seats, a gift card or certificate has too
                little balance, or the payments do not add up to the price.
        """
        infos: list[FlightInfo] = _models(flights, FlightInfo)
        people = _models(passengers, Passenger)
        payments: list[Payment] = _models(payment_methods, Payment)
        with writing(self.conn):
            user = self._get_user(user_id)
            reservation = Reservation(
                reservation_id=self._new_reservation_id(),
                user_id=user_id,
                origin=origin,
                destination=destination,
                flight_type=flight_type,
                cabin=cabin,
                flights=[],
                passengers=copy.deepcopy(people),
                payment_history=copy.deepcopy(payments),
                created_at=NOW,
                total_baggages=total_baggages,
                nonfree_baggages=nonfree_baggages,
                insurance=insurance,
            ).model_dump()
            total_price = 0
            touched: dict[str, Record] = {}  # one record a flight, so two legs add up
            taken: list[Record] = []
            for info in infos:
                number = info.flight_number
                flight = touched.get(number) or self._get_flight(number)
                touched[number] = flight
                instance = self._bookable(flight, info.date, cabin, len(people))
                price = instance["prices"][cabin]
                reservation["flights"].append(
                    reservation_flight(
                        number, flight["origin"], flight["destination"], info.date, price
                    )
                )
                taken.append(instance)
                total_price += price * len(people)
            if insurance == "yes":
                total_price += 30 * len(people)
            total_price += 50 * nonfree_baggages
            methods: dict[str, Record] = user["payment_methods"]
            for payment in payments:
                if payment.payment_id not in methods:
                    raise AirlineError(f"Payment method {payment.payment_id} not found")
                method = methods[payment.payment_id]
                if method["source"] in _STORED_CREDIT and method["amount"] < payment.amount:
                    raise AirlineError(f"Not enough balance in payment method {payment.payment_id}")
            total_payment = sum(payment.amount for payment in payments)
            if total_payment != total_price:
                raise AirlineError(
                    f"Payment amount does not add up, total price is {total_price}, "
                    f"but paid {total_payment}"
                )
            for payment in payments:
                try:
                    method = methods[payment.payment_id]
                except KeyError as error:  # a certificate listed twice, used up by the first
                    raise AirlineError(str(error)) from error
                if method["source"] == "gift_card":
                    method["amount"] -= payment.amount
                elif method["source"] == "certificate":
                    methods.pop(payment.payment_id)
            for instance in taken:
                instance["available_seats"][cabin] -= len(people)
            for flight in touched.values():
                self._put("flights", flight)
            DATABASE.insert(self.conn, "reservations", reservation)
            user["reservations"].append(reservation["reservation_id"])
            self._put("users", user)
            return reservation

    def cancel_reservation(self, reservation_id: str) -> Record:
        """Cancel the whole reservation: every payment gets its refund (a negative payment) and
        the reservation becomes 'cancelled'.

        Args:
            reservation_id: The reservation id, such as 'ZFA04Y'.

        Returns:
            The reservation after the cancellation.

        Raises:
            AirlineError: If the reservation is not found.
        """
        with writing(self.conn):
            reservation = self._get_reservation(reservation_id)
            history: list[Record] = reservation["payment_history"]
            history.extend(
                Payment(payment_id=p["payment_id"], amount=-p["amount"]).model_dump()
                for p in list(history)
            )
            reservation["status"] = "cancelled"
            self._put("reservations", reservation)
            return reservation

    def send_certificate(self, user_id: str, amount: int) -> str:
        """Send a certificate to a user, as compensation. Be careful!

        Args:
            user_id: The user, such as 'sara_doe_496'.
            amount: The certificate's value in dollars.

        Returns:
            A message naming the certificate, the user and the amount.

        Raises:
            AirlineError: If the user is not found, or already has three new certificates.
        """
        with writing(self.conn):
            user = self._get_user(user_id)
            for payment_id in new_certificate_ids:
                if payment_id not in user["payment_methods"]:
                    certificate = Certificate(id=payment_id, amount=amount, source="certificate")
                    user["payment_methods"][payment_id] = certificate.model_dump()
                    self._put("users", user)
                    return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
            raise AirlineError("Too many certificates")

    def update_reservation_baggages(
        self,
        reservation_id: str,
        total_baggages: int,
        nonfree_baggages: int,
        payment_id: str,
    ) -> Record:
        """Update the bags of a reservation; $50 for each non-free bag added.

        Args:
            reservation_id: The reservation id, such as 'ZFA04Y'.
            total_baggages: The new total number of bags.
            nonfree_baggages: The new number of bags to pay for.
            payment_id: The user's payment method that pays, such as 'credit_card_7815826' or
                'gift_card_7815826' (not a certificate).

        Returns:
            The reservation after the change.

        Raises:
            AirlineError: If the reservation, its user or the payment method is not found, the
                method is a certificate, or a gift card's balance is too small.
        """
        with writing(self.conn):
            reservation = self._get_reservation(reservation_id)
            total_price = 50 * max(0, nonfree_baggages - reservation["nonfree_baggages"])
            self._pay_update(reservation, payment_id, total_price)
            reservation["total_baggages"] = total_baggages
            reservation["nonfree_baggages"] = nonfree_baggages
            self._put("reservations", reservation)
            return reservation

    def update_reservation_flights(
        self,
        reservation_id: str,
        cabin: CabinClass,
        flights: list[FlightInfo | dict[str, Any]],
        payment_id: str,
    ) -> Record:
        """Update the flights (and cabin) of a reservation, paying or refunding the difference.

        Args:
            reservation_id: The reservation id, such as 'ZFA04Y'.
            cabin: The cabin of the whole reservation.
            flights: Every flight of the new reservation (``{"flight_number", "date"}``), those
                that do not change too.
            payment_id: The user's payment method that pays or is refunded, such as
                'credit_card_7815826' or 'gift_card_7815826' (not a certificate).

        Returns:
            The reservation after the change.

        Raises:
            AirlineError: If the reservation, its user, a flight or the payment method is not
                found, a new flight is not available that day or has too few seats, the method
                is a certificate, or a gift card's balance is too small.
        """
        infos: list[FlightInfo] = _models(flights, FlightInfo)
        with writing(self.conn):
            reservation = self._get_reservation(reservation_id)
            self._get_user(reservation["user_id"])
            seats = len(reservation["passengers"])
            total_price = 0
            new_flights: list[Record] = []
            for info in infos:
                kept = next(
                    (
                        f
                        for f in reservation["flights"]
                        if f["flight_number"] == info.flight_number
                        and f["date"] == info.date
                        and cabin == reservation["cabin"]
                    ),
                    None,
                )
                if kept is not None:
                    total_price += kept["price"] * seats
                    new_flights.append(kept)
                    continue
                flight = self._get_flight(info.flight_number)
                instance = self._bookable(flight, info.date, cabin, seats)
                price = instance["prices"][cabin]
                new_flights.append(
                    reservation_flight(
                        info.flight_number,
                        flight["origin"],
                        flight["destination"],
                        info.date,
                        price,
                    )
                )
                total_price += price * seats
            total_price -= sum(f["price"] for f in reservation["flights"]) * seats
            self._pay_update(reservation, payment_id, total_price)
            reservation["flights"] = new_flights
            reservation["cabin"] = cabin
            self._put("reservations", reservation)
            return reservation

    def update_reservation_passengers(
        self, reservation_id: str, passengers: list[Passenger | dict[str, Any]]
    ) -> Record:
        """Update the passengers of a reservation (as many as it has).

        Args:
            reservation_id: The reservation id, such as 'ZFA04Y'.
            passengers: Every passenger: ``{"first_name", "last_name", "dob"}``.

        Returns:
            The reservation after the change.

        Raises:
            AirlineError: If the reservation is not found, or the number of passengers differs.
        """
        people = _models(passengers, Passenger)
        with writing(self.conn):
            reservation = self._get_reservation(reservation_id)
            if len(people) != len(reservation["passengers"]):
                raise AirlineError("Number of passengers does not match")
            reservation["passengers"] = [
                p.model_dump() if isinstance(p, BaseModel) else copy.deepcopy(p) for p in people
            ]
            self._put("reservations", reservation)
            return reservation
