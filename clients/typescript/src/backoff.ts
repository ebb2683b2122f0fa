/** How long the client keeps retrying an answer that says it is safe to retry. */

/**
 * Bounded retries for answers with `safe_to_retry: true` (same request, same key).
 *
 * Each retry waits `Retry-After` when the gateway sent one, otherwise `initial`
 * doubling up to `maximum` (seconds). The client gives up, throwing the last
 * problem, after `attempts` sends or once the next wait would pass `total`
 * seconds of waiting.
 */
export class Backoff {
  readonly attempts: number;
  readonly total: number;
  readonly initial: number;
  readonly maximum: number;

  constructor(options: { attempts?: number; total?: number; initial?: number; maximum?: number } = {}) {
    this.attempts = options.attempts ?? 20;
    this.total = options.total ?? 30;
    this.initial = options.initial ?? 0.2;
    this.maximum = options.maximum ?? 5;
    if (!Number.isInteger(this.attempts) || this.attempts < 1) {
      throw new RangeError(`Backoff.attempts must be an integer >= 1, got ${this.attempts}`);
    }
    if (!(this.total >= 0)) {
      throw new RangeError(`Backoff.total must be >= 0, got ${this.total}`);
    }
    if (!(this.initial > 0)) {
      throw new RangeError(`Backoff.initial must be > 0, got ${this.initial}`);
    }
    if (!(this.maximum >= this.initial)) {
      throw new RangeError(`Backoff.maximum must be >= initial (${this.initial}), got ${this.maximum}`);
    }
  }

  /** Never retry: every problem is thrown at once. */
  static none(): Backoff {
    return new Backoff({ attempts: 1, total: 0 });
  }

  /** Seconds to wait before retry number `retry` (0 for the first retry). */
  delay(retry: number, retryAfter: number | null): number {
    if (retryAfter !== null) {
      return Math.max(0, retryAfter);
    }
    return Math.min(this.maximum, this.initial * 2 ** retry);
  }

  /** The wait before the next send after `sent` sends and `waited` seconds; null: give up. */
  nextDelay(sent: number, waited: number, retryAfter: number | null): number | null {
    if (sent >= this.attempts) {
      return null;
    }
    const delay = this.delay(sent - 1, retryAfter);
    if (waited + delay > this.total) {
      return null;
    }
    return delay;
  }
}

/** `Retry-After` as seconds from now: delta-seconds or an HTTP date; null when absent or bad. */
export function parseRetryAfter(value: string | null): number | null {
  if (value === null) {
    return null;
  }
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) {
    return Number(trimmed);
  }
  const when = Date.parse(trimmed);
  if (Number.isNaN(when) || !/GMT$/.test(trimmed)) {
    return null;
  }
  return Math.max(0, (when - Date.now()) / 1000);
}

/** Resolves after `seconds`; rejects with the signal's reason when it aborts first. */
export function sleep(seconds: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, seconds * 1000);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
