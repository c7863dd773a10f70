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

/** The batches of an async source (a consumer's message iterator); a failure of the source ends them with it. */
export async function* inBatches<T>(source: AsyncIterable<T>, max: number): AsyncGenerator<T[]> {
  const arrivals = new Arrivals<T>();
  let failure: { error: unknown } | undefined;
  const pump = (async () => {
    try {
      for await (const item of source) arrivals.push(item);
    } catch (error) {
      failure = { error };
    } finally {
      arrivals.end();
    }
  })();
  yield* arrivals.batches(max);
  await pump;
  if (failure !== undefined) throw failure.error;
}

/**
 * Writes that are cheaper made together: what is asked for while one batch is being written goes into the next.
 * Alone, an item waits one event-loop turn (for whatever was asked for beside it); under load the batches grow, at
 * most `max` at a time, with no timer. Each asker is told how its own batch went.
 */
export class Coalescing<T> {
  private readonly waiting: { item: T; settle: (failure?: { error: unknown }) => void }[] = [];
  private writing = false;

  constructor(
    private readonly write: (items: T[]) => Promise<void>,
    private readonly max: number,
  ) {}

  add(item: T): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.waiting.push({
        item,
        settle: (failure) => {
          if (failure === undefined) resolve();
          else reject(failure.error instanceof Error ? failure.error : new Error(String(failure.error)));
        },
      });
      if (!this.writing) void this.drain();
    });
  }

  private async drain(): Promise<void> {
    this.writing = true;
    await new Promise((resolve) => setImmediate(resolve));
    while (this.waiting.length > 0) {
      const batch = this.waiting.splice(0, this.max);
      let failure: { error: unknown } | undefined;
      try {
        await this.write(batch.map((one) => one.item));
      } catch (error) {
        failure = { error };
      }
      for (const one of batch) one.settle(failure);
    }
    this.writing = false;
  }
}
