"""Schemas used by the structured log type tests."""

from __future__ import annotations

from typing import Any

ORDER_V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "amount", "type": "float"},
        {"name": "city", "type": "string"},
    ],
}
ORDER_V2: dict[str, Any] = {  # backward compatible: promotions and a field with a default
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": "double"},
        {"name": "city", "type": "string"},
        {"name": "coupon", "type": ["null", "string"], "default": None},
    ],
}
ORDER_BROKEN: dict[str, Any] = {  # a field without a default: v1's data cannot be read
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": "double"},
        {"name": "city", "type": "string"},
        {"name": "country", "type": "string"},
    ],
}
