/**
 * Signing a batch on threads of its own. A fleet's roll-out signs thousands of declarations with one key; handed to
 * the thread pool one by one, each signature costs the main thread a job of its own (set up, queued, called back)
 * and, on a machine whose cores are all busy, waits on the pool's threads besides: a fifth of the main thread's
 * time in a roll-out. Here a batch is one message to a thread and one back, and the main thread records and sends
 * the previous batch meanwhile.
 */
import type { KeyObject } from "node:crypto";
import { availableParallelism } from "node:os";
import { Worker } from "node:worker_threads";
import { KeyError } from "../errors.js";
import { requireEd25519 } from "./signing.js";

/** Ed25519's signature length. */
const signatureBytes = 64;
/** Its length in base64. */
const signatureBase64Length = 88;

/**
 * How many threads sign: one a core, at most four. The main thread is not left a core of its own: in a roll-out it
 * waits on the signing for a third of the time or more, and a thread on its core signs meanwhile (on two cores, a
 * plan change every one of 1,000 nodes holds rolled out in 90 ms rather than 125, median of 15 rounds a side).
 */
export function signingThreads(cores = availableParallelism()): number {
  return Math.min(4, Math.max(1, cores));
}

/**
 * The thread's code: CommonJS, a string because each command is one bundled file. It signs each batch it is given
 * with the key it was started with and answers with the signatures end to end and each message's envelope: its text
 * written around the message's base64 and its signature's (`head`, payload, `mid`, signature, `tail`), the texts end
 * to end as bytes with where each ends; or with why it could not. The envelopes are written straight into one buffer
 * of the size they take (base64 is ASCII, one byte a character): as strings joined and encoded they took a fifth of
 * the thread's time for 1,204-byte declarations, now about a twentieth.
 */
const threadCode = `
const { parentPort, workerData } = require("node:worker_threads");
const { sign } = require("node:crypto");
const seal = ({ bytes, ends, head, mid, tail }) => {
  const count = ends.length;
  const messages = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  // Each one by name: taken apart from an array, V8 threw this function's optimized code away at its first run (a
  // wrong map at the array's iterator) and the thread compiled it again in a later roll-out, 20-30 ms each time.
  const headBytes = Buffer.from(head);
  const midBytes = Buffer.from(mid);
  const tailBytes = Buffer.from(tail);
  const around = headBytes.length + midBytes.length + ${signatureBase64Length} + tailBytes.length;
  let size = 0;
  for (let i = 0, start = 0; i < count; start = ends[i], i++) size += around + Math.ceil((ends[i] - start) / 3) * 4;
  const signatures = new Uint8Array(count * ${signatureBytes});
  const texts = new Uint8Array(size);
  const out = Buffer.from(texts.buffer);
  const textEnds = new Uint32Array(count);
  let at = 0;
  for (let i = 0, start = 0; i < count; start = ends[i], i++) {
    const message = messages.subarray(start, ends[i]);
    const signature = sign(null, message, workerData.key);
    signatures.set(signature, i * ${signatureBytes});
    at += headBytes.copy(out, at);
    at += out.write(message.toString("base64"), at, "latin1");
    at += midBytes.copy(out, at);
    at += out.write(signature.toString("base64"), at, "latin1");
    at += tailBytes.copy(out, at);
    textEnds[i] = at;
  }
  if (at !== size) throw new Error("the envelopes took " + at + " bytes, not the " + size + " counted");
  return { signatures, texts, ends: textEnds };
};
parentPort.on("message", ({ id, texts }) => {
  try {
    const sealed = seal(texts);
    parentPort.postMessage({ id, ...sealed }, [sealed.signatures.buffer, sealed.texts.buffer, sealed.ends.buffer]);
  } catch (error) {
    const code = error !== null && typeof error === "object" && typeof error.code === "string" ? " (" + error.code + ")" : "";
    parentPort.postMessage({ id, error: (error instanceof Error ? error.message : String(error)) + code });
  }
});
`;

/** How an envelope's text is written around its payload and its signature (both base64). */
export interface EnvelopeWrapping {
  head: string;
  mid: string;
  tail: string;
}

/** Messages sealed on a thread: their signatures end to end, and their envelopes' texts end to end as bytes. */
interface SealedPart {
  signatures: Uint8Array;
  texts: Uint8Array;
  ends: Uint32Array;
}

type ThreadAnswer = ({ id: number } & SealedPart) | { id: number; error: string };

interface Pending {
  resolve: (answer: SealedPart) => void;
  reject: (error: Error) => void;
}

/** One signing thread and the batches it has not answered yet. */
class SigningThread {
  private readonly worker: Worker;
  private readonly pending = new Map<number, Pending>();
  private nextId = 0;
  private gone: Error | undefined;

  constructor(key: KeyObject) {
    this.worker = new Worker(threadCode, { eval: true, workerData: { key }, execArgv: [] });
    this.worker.on("message", (answer: ThreadAnswer) => {
      const waiting = this.pending.get(answer.id);
      if (waiting === undefined) return;
      this.pending.delete(answer.id);
      if (this.pending.size === 0) this.worker.unref();
      if ("error" in answer) waiting.reject(new KeyError(`signing failed: ${answer.error}`));
      else waiting.resolve(answer);
    });
    this.worker.on("error", (error) =>
      this.fail(new KeyError(`the signing thread failed: ${error.message}`)),
    );
    this.worker.on("exit", (code) => this.fail(new KeyError(`the signing thread ended (exit code ${code})`)));
    // An idle thread never keeps a process alive (`sign` holds it while a batch is under way). After the
    // listeners: adding a message listener holds the thread's port again.
    this.worker.unref();
  }

  /** Whether it can take batches: it has not failed or ended. */
  get usable(): boolean {
    return this.gone === undefined;
  }

  /** How many batches it has not answered. */
  get load(): number {
    return this.pending.size;
  }

  /** Seals `messages` (end to end in `bytes`, each ending at its place in `ends`), both handed over to the thread. */
  seal(
    bytes: Uint8Array<ArrayBuffer>,
    ends: Uint32Array<ArrayBuffer>,
    wrapping: EnvelopeWrapping,
  ): Promise<SealedPart> {
    if (this.gone !== undefined) return Promise.reject(this.gone);
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      // The process waits for the answer as it waits for any I/O under way.
      if (this.pending.size === 0) this.worker.ref();
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ id, texts: { bytes, ends, ...wrapping } }, [bytes.buffer, ends.buffer]);
    });
  }

  private fail(error: Error): void {
    this.gone ??= error;
    for (const waiting of this.pending.values()) waiting.reject(error);
    this.pending.clear();
    this.worker.unref();
  }

  async stop(): Promise<void> {
    this.gone ??= new KeyError("the signing threads were stopped");
    await this.worker.terminate();
  }
}

/**
 * Threads that sign batches with one Ed25519 key. A batch is split across the threads, each part answered in one
 * message; a thread that fails or ends fails the batches it held, and the next batch starts a new one in its place.
 */
export class SigningPool {
  private threads: SigningThread[] = [];

  constructor(
    private readonly key: KeyObject,
    private readonly size = signingThreads(),
  ) {
    requireEd25519(key, "private");
  }

  /**
   * Each message sealed: its 64-byte Ed25519 signature (the bytes `sign` gives) and its envelope's text as bytes
   * (`wrapping` around its base64 and its signature's), in the messages' order. The messages are copied end to end
   * once and handed to the threads, and the envelopes come back the same way: nothing is copied per message between
   * the threads.
   */
  async sealAll(
    messages: readonly Uint8Array[],
    wrapping: EnvelopeWrapping,
  ): Promise<{ signatures: Uint8Array[]; envelopes: Uint8Array[] }> {
    if (messages.length === 0) return { signatures: [], envelopes: [] };
    const { threads, parts } = this.share(messages);
    const answers = await Promise.all(
      parts.map((part, i) => {
        const thread = threads[i];
        if (thread === undefined) throw new KeyError(`no signing thread for part ${i + 1}`);
        const ends = new Uint32Array(part.length);
        let total = 0;
        part.forEach((message, j) => (ends[j] = total += message.byteLength));
        const bytes = new Uint8Array(total);
        part.forEach((message, j) => bytes.set(message, (ends[j] ?? 0) - message.byteLength));
        return thread.seal(bytes, ends, wrapping);
      }),
    );
    const signatures: Uint8Array[] = [];
    const envelopes: Uint8Array[] = [];
    answers.forEach((answer, i) => {
      const count = parts[i]?.length ?? 0;
      if (answer.signatures.byteLength !== count * signatureBytes || answer.ends.length !== count)
        throw new KeyError(`a signing thread answered ${answer.ends.length} envelopes for ${count}`);
      let start = 0;
      for (let j = 0; j < count; j++) {
        const end = answer.ends[j] ?? 0;
        signatures.push(answer.signatures.subarray(j * signatureBytes, (j + 1) * signatureBytes));
        envelopes.push(answer.texts.subarray(start, end));
        start = end;
      }
    });
    return { signatures, envelopes };
  }

  /** The usable threads, started where missing, and the batch in one part per thread it needs. */
  private share(messages: readonly Uint8Array[]): { threads: SigningThread[]; parts: Uint8Array[][] } {
    this.threads = this.threads.filter((thread) => thread.usable);
    while (this.threads.length < this.size) this.threads.push(new SigningThread(this.key));
    // The least loaded threads first; a batch smaller than the threads does not wake them all.
    const threads = [...this.threads].sort((a, b) => a.load - b.load);
    const each = Math.ceil(messages.length / Math.min(threads.length, messages.length));
    const parts = Array.from({ length: Math.ceil(messages.length / each) }, (_, i) =>
      messages.slice(i * each, (i + 1) * each),
    );
    return { threads, parts };
  }

  /** Ends every thread; batches still under way fail. */
  async stop(): Promise<void> {
    const threads = this.threads;
    this.threads = [];
    await Promise.all(threads.map((thread) => thread.stop()));
  }
}
