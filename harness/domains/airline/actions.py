"""The six airline write tools as transactional actions (``hx.action``).

:func:`build_actions` wraps each write tool of an :class:`AirlineTools` in an
:class:`hx.Action` with upstream's name, arguments and docstring, and gives it what a
transaction needs:

- ``writes``: the reservation (``reservations/{reservation_id}``); for a booking the id it
  will take, the user and every flight booked; the user too when a gift card pays an update or
  a certificate is sent.
- Preconditions named after the policy's rules, mirroring upstream's validations (never
  stricter: a call upstream accepts passes all of them; a call upstream refuses is refused by
  one of them or by the tool's own :class:`AirlineError`, which leaves no effect because every
  write tool runs in one SQLite transaction).
- Postconditions that check each row the tool writes afterwards (``ctx.before`` /
  ``ctx.after``), never the tool's return value: the row must be exactly what upstream's tool
  leaves, computed here from the row before and the arguments.
- One compensation that writes back the before-row of every row the action changed (a booked
  reservation is deleted again).
- Idempotency keys: the canonical hash of the arguments plus the *occurrence number* of that
  identical call in the episode (:class:`harness.domains.base.OccurrenceKeys`): upstream runs a
  repeated call again (a second booking takes the next id), and so do these actions.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from pydantic import BaseModel

import harness as hx
from harness.domains import tau2
from harness.domains.airline.db import DATABASE, Record, reservation_flight
from harness.domains.airline.models import FlightInfo, Passenger, Payment
from harness.domains.airline.tools import (
    NOW,
    WRITE_TOOLS,
    AirlineTools,
    as_sent,
    new_certificate_ids,
    new_reservation_ids,
)

__all__ = ["POSTCONDITIONS", "PRECONDITIONS", "build_actions"]

Check = Callable[[hx.Context], bool]

_BY_LIST: Final[Mapping[str, tuple[str, type[BaseModel]]]] = {
    "flights": ("flights", FlightInfo),
    "passengers": ("passengers", Passenger),
    "payment_methods": ("payment_methods", Payment),
}


# -- reading the arguments and the state -----------------------------------------------------


def _parsed(ctx: hx.Context, arg: str) -> list[Any] | None:
    """The list argument ``arg`` as upstream's models, or None where upstream's conversion
    fails (a dict that does not fit; a list mixing models and other values)."""
    model = _BY_LIST[arg][1]
    values = as_sent(getattr(ctx.args, arg))
    if not isinstance(values, list) or not all(isinstance(v, dict) for v in values):
        return None
    try:
        return [model(**v) for v in values]
    except Exception:
        return None


def _infos(ctx: hx.Context) -> list[FlightInfo]:
    return _parsed(ctx, "flights") or []


def _user(ctx: hx.Context, user_id: str) -> Record | None:
    user: Record | None = ctx.state.get(f"users/{user_id}")
    return user


def _reservation(ctx: hx.Context) -> Record | None:
    reservation: Record | None = ctx.state.get(f"reservations/{ctx.args.reservation_id}")
    return reservation


def _booker(ctx: hx.Context) -> Record | None:
    """The user who books (``book_reservation``) or whose reservation changes."""
    if ctx.action in ("book_reservation", "send_certificate"):
        return _user(ctx, ctx.args.user_id)
    reservation = _reservation(ctx)
    return None if reservation is None else _user(ctx, reservation["user_id"])


def _seats(ctx: hx.Context) -> int:
    """How many seats each flight needs: the passengers booked, or the reservation's."""
    if ctx.action == "book_reservation":
        return len(_parsed(ctx, "passengers") or [])
    reservation = _reservation(ctx)
    return 0 if reservation is None else len(reservation["passengers"])


def _kept(reservation: Record, info: FlightInfo, cabin: str) -> Record | None:
    """The reservation's flight an update keeps as it is (same flight, date and cabin)."""
    if cabin != reservation["cabin"]:
        return None
    return next(
        (
            f
            for f in reservation["flights"]
            if f["flight_number"] == info.flight_number and f["date"] == info.date
        ),
        None,
    )


def _new_flights(ctx: hx.Context) -> list[FlightInfo]:
    """The flights the call books anew (for an update: those not kept)."""
    infos = _infos(ctx)
    if ctx.action == "book_reservation":
        return infos
    reservation = _reservation(ctx)
    if reservation is None:
        return []
    return [i for i in infos if _kept(reservation, i, ctx.args.cabin) is None]


def _on_date(ctx: hx.Context, info: FlightInfo) -> Record | None:
    flight = ctx.state.get(f"flights/{info.flight_number}")
    if flight is None:
        return None
    found: Record | None = flight["dates"].get(info.date)
    return found


def _flight_prices(ctx: hx.Context, reservation: Record | None) -> tuple[list[Record], int]:
    """The reservation's flights after the call and their total price for all passengers
    (before an update's old price is taken off), as upstream prices them.

    Args:
        ctx: The call.
        reservation: The reservation an update changes, as it is before (None: a booking).
    """
    cabin, seats = ctx.args.cabin, _seats(ctx)
    flights: list[Record] = []
    total = 0
    for info in _infos(ctx):
        kept = None if reservation is None else _kept(reservation, info, cabin)
        if kept is None:
            flight = ctx.state.get(f"flights/{info.flight_number}")
            on_date = _on_date(ctx, info)
            if flight is None or on_date is None or "prices" not in on_date:
                raise LookupError(f"flight {info.flight_number} on {info.date} has no price")
            kept = reservation_flight(
                info.flight_number,
                flight["origin"],
                flight["destination"],
                info.date,
                on_date["prices"][cabin],
            )
        flights.append(kept)
        total += kept["price"] * seats
    return flights, total


def _booking_price(ctx: hx.Context) -> int:
    """What a booking costs: flights for every passenger, insurance, non-free bags."""
    total = _flight_prices(ctx, None)[1]
    if ctx.args.insurance == "yes":
        total += 30 * _seats(ctx)
    return int(total + 50 * ctx.args.nonfree_baggages)


def _update_price(ctx: hx.Context, reservation: Record) -> int:
    """What an update costs (negative: a refund)."""
    if ctx.action == "update_reservation_baggages":
        return int(50 * max(0, ctx.args.nonfree_baggages - reservation["nonfree_baggages"]))
    old = sum(f["price"] for f in reservation["flights"]) * len(reservation["passengers"])
    return int(_flight_prices(ctx, reservation)[1] - old)


def _method(ctx: hx.Context) -> Record | None:
    user = _booker(ctx)
    if user is None:
        return None
    method: Record | None = user["payment_methods"].get(ctx.args.payment_id)
    return method


# -- scopes ----------------------------------------------------------------------------------


def _key(ctx: hx.Context) -> str:
    """The reservation's key: the one named, or (a booking) the new one in the scope."""
    if ctx.action == "book_reservation":
        return next(k for k in ctx.before if k.startswith("reservations/"))
    return f"reservations/{ctx.args.reservation_id}"


def _scope(state: Any, name: str) -> Callable[[Any], list[str]]:
    """The ``writes`` function of the tool ``name``: the rows it may change, as tight as known."""

    def writes(args: Any) -> list[str]:
        if name == "send_certificate":
            return [f"users/{args.user_id}"]
        if name == "book_reservation":
            free = next(
                (i for i in new_reservation_ids if state.get(f"reservations/{i}") is None),
                new_reservation_ids[-1],
            )
            numbers = dict.fromkeys(
                i["flight_number"]
                for i in as_sent(args.flights)
                if isinstance(i, dict) and isinstance(i.get("flight_number"), str)
            )
            return [f"reservations/{free}", f"users/{args.user_id}"] + [
                f"flights/{n}" for n in numbers
            ]
        keys = [f"reservations/{args.reservation_id}"]
        if name != "update_reservation_passengers" and name != "cancel_reservation":
            reservation = state.get(keys[0])
            user = None if reservation is None else state.get(f"users/{reservation['user_id']}")
            method = None if user is None else user["payment_methods"].get(args.payment_id)
            if method is not None and method["source"] == "gift_card":
                keys.append(f"users/{reservation['user_id']}")
        return keys

    writes.__name__ = f"{name}_writes"
    return writes


# -- preconditions (the policy's rules, as upstream enforces them) ---------------------------


def arguments_fit_upstreams_models(ctx: hx.Context) -> bool:
    """Every flight, passenger and payment given has the fields upstream's models require."""
    return all(_parsed(ctx, arg) is not None for arg in _BY_LIST if hasattr(ctx.args, arg))


def user_exists(ctx: hx.Context) -> bool:
    """The user id names a user (for an update: the reservation's user)."""
    return _booker(ctx) is not None


def reservation_id_free(ctx: hx.Context) -> bool:
    """The user makes at most three new reservations (upstream has three ids for them)."""
    return any(ctx.state.get(f"reservations/{i}") is None for i in new_reservation_ids)


def reservation_exists(ctx: hx.Context) -> bool:
    """The reservation id names a reservation."""
    return _reservation(ctx) is not None


def flights_exist(ctx: hx.Context) -> bool:
    """Every flight to book is one of the airline's flights."""
    return all(ctx.state.get(f"flights/{i.flight_number}") for i in _new_flights(ctx))


def flights_fly_that_day(ctx: hx.Context) -> bool:
    """Every flight to book is scheduled on its date."""
    return all(_on_date(ctx, i) is not None for i in _new_flights(ctx))


def flights_available(ctx: hx.Context) -> bool:
    """Every flight to book is still available for booking on its date (not flown, not
    cancelled)."""
    return all((_on_date(ctx, i) or {}).get("status") == "available" for i in _new_flights(ctx))


def seats_for_every_passenger(ctx: hx.Context) -> bool:
    """Every flight to book has a seat in the cabin for each passenger."""
    seats, cabin = _seats(ctx), ctx.args.cabin
    return all(
        (_on_date(ctx, i) or {}).get("available_seats", {}).get(cabin, -1) >= seats
        for i in _new_flights(ctx)
    )


def payment_methods_exist(ctx: hx.Context) -> bool:
    """Every payment is from one of the user's payment methods."""
    user = _booker(ctx)
    payments = _parsed(ctx, "payment_methods") or []
    return user is not None and all(p.payment_id in user["payment_methods"] for p in payments)


def balances_cover_payments(ctx: hx.Context) -> bool:
    """A gift card or certificate pays at most its balance."""
    user = _booker(ctx)
    if user is None:
        return False
    for payment in _parsed(ctx, "payment_methods") or []:
        method = user["payment_methods"].get(payment.payment_id, {})
        if method.get("source") in ("gift_card", "certificate") and method["amount"] < (
            payment.amount
        ):
            return False
    return True


def payments_add_up(ctx: hx.Context) -> bool:
    """The payments add up to the price exactly (flights for every passenger, $30 a passenger
    for insurance, $50 a non-free bag)."""
    paid = sum(p.amount for p in _parsed(ctx, "payment_methods") or [])
    try:
        return bool(paid == _booking_price(ctx))
    except LookupError:
        return False


def certificate_id_free(ctx: hx.Context) -> bool:
    """The user has been sent fewer than three certificates (upstream has three ids)."""
    user = _booker(ctx)
    return user is not None and any(i not in user["payment_methods"] for i in new_certificate_ids)


def payment_method_exists(ctx: hx.Context) -> bool:
    """The payment method is one of the reservation's user's."""
    return _method(ctx) is not None


def not_a_certificate(ctx: hx.Context) -> bool:
    """A certificate cannot pay for a change to a reservation."""
    method = _method(ctx)
    return method is not None and method["source"] != "certificate"


def gift_card_covers_price(ctx: hx.Context) -> bool:
    """A gift card paying for the change has the balance for it."""
    method, reservation = _method(ctx), _reservation(ctx)
    if method is None or reservation is None:
        return False
    if method["source"] != "gift_card":
        return True
    try:
        return bool(method["amount"] >= _update_price(ctx, reservation))
    except LookupError:
        return False


def same_number_of_passengers(ctx: hx.Context) -> bool:
    """The reservation keeps its number of passengers."""
    reservation = _reservation(ctx)
    people = _parsed(ctx, "passengers")
    return (
        reservation is not None
        and people is not None
        and (len(people) == len(reservation["passengers"]))
    )


_NEW_FLIGHTS: Final = (flights_exist, flights_fly_that_day, flights_available)

# Upstream's validation order, one rule per check; the first false one names the refusal.
PRECONDITIONS: Final[Mapping[str, tuple[Check, ...]]] = {
    "book_reservation": (
        arguments_fit_upstreams_models,
        user_exists,
        reservation_id_free,
        *_NEW_FLIGHTS,
        seats_for_every_passenger,
        payment_methods_exist,
        balances_cover_payments,
        payments_add_up,
    ),
    "cancel_reservation": (reservation_exists,),
    "send_certificate": (user_exists, certificate_id_free),
    "update_reservation_baggages": (
        reservation_exists,
        user_exists,
        payment_method_exists,
        not_a_certificate,
        gift_card_covers_price,
    ),
    "update_reservation_flights": (
        arguments_fit_upstreams_models,
        reservation_exists,
        user_exists,
        *_NEW_FLIGHTS,
        seats_for_every_passenger,
        payment_method_exists,
        not_a_certificate,
        gift_card_covers_price,
    ),
    "update_reservation_passengers": (
        arguments_fit_upstreams_models,
        reservation_exists,
        same_number_of_passengers,
    ),
}
"""Each write tool's preconditions, in upstream's validation order."""


# -- postconditions: each row written is what upstream's tool leaves -------------------------


def _expected_reservation(ctx: hx.Context) -> Record:
    """The reservation after the call, from the row before and the arguments."""
    if ctx.action == "book_reservation":
        people = _parsed(ctx, "passengers") or []
        payments = _parsed(ctx, "payment_methods") or []
        return {
            "reservation_id": _key(ctx).partition("/")[2],
            "user_id": ctx.args.user_id,
            "origin": ctx.args.origin,
            "destination": ctx.args.destination,
            "flight_type": ctx.args.flight_type,
            "cabin": ctx.args.cabin,
            "flights": _flight_prices(ctx, None)[0],
            "passengers": [p.model_dump() for p in people],
            "payment_history": [p.model_dump() for p in payments],
            "created_at": NOW,
            "total_baggages": ctx.args.total_baggages,
            "nonfree_baggages": ctx.args.nonfree_baggages,
            "insurance": ctx.args.insurance,
            "status": None,
        }
    reservation: Record = copy.deepcopy(ctx.before[_key(ctx)])
    history: list[Record] = reservation["payment_history"]
    if ctx.action == "cancel_reservation":
        history += [{**p, "amount": -p["amount"]} for p in list(history)]
        reservation["status"] = "cancelled"
    elif ctx.action == "update_reservation_passengers":
        reservation["passengers"] = [p.model_dump() for p in _parsed(ctx, "passengers") or []]
    else:
        price = _update_price(ctx, ctx.before[_key(ctx)])
        if price != 0:
            history.append({"payment_id": ctx.args.payment_id, "amount": price})
        if ctx.action == "update_reservation_baggages":
            reservation["total_baggages"] = ctx.args.total_baggages
            reservation["nonfree_baggages"] = ctx.args.nonfree_baggages
        else:
            reservation["flights"] = _flight_prices(ctx, ctx.before[_key(ctx)])[0]
            reservation["cabin"] = ctx.args.cabin
    return reservation


def _expected_user(ctx: hx.Context, user: Record) -> Record:
    """The user after the call: what it paid from gift cards and certificates, a booking's
    id, a certificate sent."""
    user = copy.deepcopy(user)
    methods: dict[str, Record] = user["payment_methods"]
    if ctx.action == "send_certificate":
        new_id = next(i for i in new_certificate_ids if i not in methods)
        methods[new_id] = {"source": "certificate", "id": new_id, "amount": float(ctx.args.amount)}
    elif ctx.action == "book_reservation":
        for payment in _parsed(ctx, "payment_methods") or []:
            method = methods[payment.payment_id]
            if method["source"] == "gift_card":
                method["amount"] -= payment.amount
            elif method["source"] == "certificate":
                methods.pop(payment.payment_id)
        user["reservations"].append(_key(ctx).partition("/")[2])
    else:
        methods[ctx.args.payment_id]["amount"] -= _update_price(ctx, ctx.before[_key(ctx)])
    return user


def _expected_flight(ctx: hx.Context, flight: Record) -> Record:
    """A booked flight after the booking: a seat in the cabin taken for each passenger, on
    every date it is booked for."""
    flight = copy.deepcopy(flight)
    for info in _infos(ctx):
        if info.flight_number == flight["flight_number"]:
            flight["dates"][info.date]["available_seats"][ctx.args.cabin] -= _seats(ctx)
    return flight


def _rows_as_expected(ctx: hx.Context, table: str) -> bool:
    for key, before in ctx.before.items():
        if not key.startswith(f"{table}/"):
            continue
        if table == "reservations":
            expected: Record | None = _expected_reservation(ctx)
        elif before is None:
            return False
        elif table == "users":
            expected = _expected_user(ctx, before)
        else:
            expected = _expected_flight(ctx, before)
        if _typed(ctx.after.get(key)) != _typed(expected):
            return False
    return True


def _typed(record: Record | None) -> str:
    """A record as JSON text, so an integer never passes for a float (``100`` for ``100.0``):
    upstream's amounts keep their type, and so must ours."""
    return json.dumps(record, sort_keys=True)


def reservation_as_upstream_leaves_it(ctx: hx.Context) -> bool:
    """The reservation is exactly what upstream's tool leaves: booked, cancelled (a refund per
    payment), or updated with the difference paid, and nothing else changed."""
    return _rows_as_expected(ctx, "reservations")


def user_as_upstream_leaves_it(ctx: hx.Context) -> bool:
    """The user paid exactly from gift cards (their balance down) and certificates (used up),
    got the booking's id or the certificate sent, and nothing else changed."""
    return _rows_as_expected(ctx, "users")


def seats_taken(ctx: hx.Context) -> bool:
    """Each booked flight has one seat fewer in the cabin for each passenger, on its date, and
    nothing else changed."""
    return _rows_as_expected(ctx, "flights")


_ROWS: Final = (reservation_as_upstream_leaves_it, user_as_upstream_leaves_it)

POSTCONDITIONS: Final[Mapping[str, tuple[Check, ...]]] = {
    "book_reservation": (*_ROWS, seats_taken),
    "cancel_reservation": (reservation_as_upstream_leaves_it,),
    "send_certificate": (user_as_upstream_leaves_it,),
    "update_reservation_baggages": _ROWS,
    "update_reservation_flights": _ROWS,
    "update_reservation_passengers": (reservation_as_upstream_leaves_it,),
}
"""Each write tool's postconditions, checked against the rows after execution."""


# -- building ----------------------------------------------------------------------------------


def _recovered_result(tools: AirlineTools, name: str) -> Callable[[hx.Context], Any]:
    """What a write returns, read back when its answer was lost (as upstream returns it)."""

    def recovered(ctx: hx.Context) -> Any:
        if name == "send_certificate":
            before = ctx.before[f"users/{ctx.args.user_id}"]["payment_methods"]
            after = ctx.after[f"users/{ctx.args.user_id}"]["payment_methods"]
            (new_id,) = (k for k in after if k not in before)
            return f"Certificate {new_id} added to user {ctx.args.user_id} with amount " + (
                f"{ctx.args.amount}."
            )
        return tools.get_reservation_details(_key(ctx).partition("/")[2])

    recovered.__name__ = f"{name}_from_state"
    return recovered


# build_actions(tools, state): each of the six write tools as an action with upstream's name,
# arguments and docstring, its scope, preconditions, postconditions, compensation and key.
build_actions: Final = functools.partial(
    tau2.build_actions,
    names=WRITE_TOOLS,
    scope=_scope,
    preconditions=PRECONDITIONS,
    postconditions=POSTCONDITIONS,
    recovered=_recovered_result,
    database=DATABASE,
)
