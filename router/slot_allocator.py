"""Free-slot bookkeeping for the target model's KV pool (page size 1).

The router, not the model service, decides which KV slot holds each token; the service only
reads and writes the slots it is told about. A slot is an int in ``[0, num_slots)``.
"""

from collections.abc import Iterable


class OutOfSlots(Exception):
    """Raised when an allocation asks for more slots than can be made free."""


class SlotAllocator:
    """Hands out and takes back KV slots, O(1) per slot.

    Invariants:
      * every slot in ``[0, num_slots)`` is either free (in ``_free_set`` and ``_free_stack``,
        exactly once) or owned by exactly one holder outside the allocator;
      * ``allocate`` and ``free`` are all-or-nothing: when they raise, nothing changed.
    """

    def __init__(self, num_slots: int) -> None:
        if num_slots <= 0:
            raise ValueError(f"num_slots must be positive, got {num_slots}")
        self._num_total = num_slots
        # Reversed so that a fresh allocator hands out low slot numbers first, which makes logs
        # and test failures easier to read; correctness does not depend on the order.
        self._free_stack: list[int] = list(range(num_slots - 1, -1, -1))
        self._free_set: set[int] = set(self._free_stack)

    @property
    def num_total(self) -> int:
        return self._num_total

    @property
    def num_free(self) -> int:
        return len(self._free_stack)

    def is_free(self, slot: int) -> bool:
        """True when ``slot`` is currently free (not owned by anyone)."""
        return slot in self._free_set

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free slots; the caller owns them until it passes them to ``free``.

        Raises OutOfSlots (allocating nothing) when fewer than ``n`` are free.
        """
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of slots: {n}")
        if n > len(self._free_stack):
            raise OutOfSlots(
                f"asked for {n} KV slots but only {len(self._free_stack)} of "
                f"{self._num_total} are free"
            )
        if n == 0:
            return []
        slots = self._free_stack[-n:]
        del self._free_stack[-n:]
        self._free_set.difference_update(slots)
        return slots

    def free(self, slots: Iterable[int]) -> None:
        """Return slots to the pool.

        Raises ValueError (freeing nothing) on an out-of-range slot, a slot that is already
        free, or a slot listed twice in ``slots``.
        """
        to_free = list(slots)
        seen: set[int] = set()
        for slot in to_free:
            if not 0 <= slot < self._num_total:
                raise ValueError(f"slot {slot} is out of range [0, {self._num_total})")
            if slot in self._free_set or slot in seen:
                raise ValueError(f"double free of slot {slot}")
            seen.add(slot)
        self._free_stack.extend(to_free)
        self._free_set.update(seen)
