/**
 * Handing the control plane what has arrived in batches: whatever waits when it is ready for more, in arrival
 * order, at most `max` at a time. Under light traffic a batch is one message and nothing waits on a timer; under
 * load the batches grow, and the store is written once per batch instead of once per message.
 */
/** How many event-loop turns a batch may wait for more to arrive. */
const gatherTurns = 8;

export class Arrivals<T> {
  private readonly waiting: T[] = [];
  private wake: (() => void) | undefined;
  private ended = false;

  push(item: T): void {
    this.waiting.push(item);
    this.wake?.();
  }

  /** No more arrivals: the batches end once what waits is handed over. */
  end(): void {
    this.ended = true;
    this.wake?.();
  }

  async *batches(max: number): AsyncGenerator<T[]> {
    for (;;) {
      if (this.waiting.length > 0) {
        // More arriving while the last batch was handled means load: let the event loop read what the socket
        // holds (a turn or a few) before handing over, so a batch is not cut at one read's worth. Alone, a message
        // waits one turn. Every batch waits one turn at least, even with a full batch waiting: a long backlog
        // must never keep timers (the lease's renewal, the last_seen flush) waiting behind it.
        for (let turn = 0; turn < gatherTurns; turn++) {
          const before = this.waiting.length;
          await new Promise((resolve) => setImmediate(resolve));
          if (this.waiting.length === before || this.waiting.length >= max) break;
        }
        yield this.waiting.splice(0, max);
        continue;
      }
      if (this.ended) return;
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = undefined;
    }
  }
}
