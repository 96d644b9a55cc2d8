"""A consumer's letters: what it publishes instead of redelivering, one module per thing held.

* :mod:`.publisher` -- :class:`~.publisher.DeadLetterPublisher`: one ordered producer per letter
  topic, Java's producer names and dead-letter properties (imports pulsar-client);
* :mod:`.java` -- Java's retry-letter topic names and properties (``RECONSUMETIMES``,
  ``DELAY_TIME``, ...), read and written: pure;
* :mod:`.retry` -- :class:`~.retry.RetryLetters` (``reconsume_later``) and
  :class:`~.retry.TerminalDeadLetters` (``dead_letter``) over the publishers;
* :mod:`.in_flight` -- :class:`~.in_flight.ConsumerDeadLetters`: the tracker's dead-letter hook
  and the letters being published (no copy of their message surfaces meanwhile).
"""
