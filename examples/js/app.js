// The conformance agent of the Sent Voice Agents protocol (protocol.md §9.2) in JavaScript, plus the
// three commands voicehost's own tests use: `count`, `panic` and the saved utterance counter. It mirrors
// examples/conformance/src/lib.rs and builds unchanged with StarlingMonkey (componentize-js) and QuickJS
// (componentize-qjs): see README.md.
//
// | trigger                             | action                                                          |
// |-------------------------------------|-----------------------------------------------------------------|
// | session start of a text call        | say "Hello from the conformance agent."                         |
// | user said, with `correction`        | `clear()` first (stop if the call has ended), then the command  |
// | "echo <text>"                       | say <text>                                                      |
// | "stream <word> <rest>"              | say <word> with `last: false`, then say <rest>                  |
// | "transfer"                          | tool `transfer` {"to":{"kind":"user","value":"conformance-desk"}} |
// | "hangup"                            | tool `hangup`, no arguments                                     |
// | "dtmf <digits>"                     | tool `send_dtmf` {"digits":"<digits>"}                          |
// | "hold"                              | tool `hold` {"held":true}                                       |
// | "count"                             | say "utterances: N" (the saved counter, see below)              |
// | "panic"                             | the instance traps                                              |
// | any other text                      | nothing                                                         |
// | tool result, `outcome` an `err`     | say "Tool failed: <error.code>"                                 |
// | audio                               | send the same samples back (echo)                               |
//
// The command is the text up to the first space. If an action is refused with `ended`, the agent stops
// processing the utterance; other refusals are logged and the next action goes on.
//
// Every utterance first adds one to a counter saved with `save("utterances", …)` as decimal ASCII (before
// its command runs, so "panic" and "count" count too); "count" reads it back with `load`. Saved state
// survives a restart, so "echo a", "panic", "count" says "utterances: 3" from the fresh instance.

import * as session from 'voicehost:agent/session@0.3.0';
import * as logging from 'wasi:logging/logging@0.1.0-draft';

/** What the conformance agent says first in a text call. */
const GREETING = 'Hello from the conformance agent.';

/** The key of the saved utterance counter. */
const COUNTER_KEY = 'utterances';

// ----- small helpers over the `session` import (worth copying into any agent) -----

/** Logs `message` at `level` ('trace' … 'critical') through wasi:logging, with no context. */
function log(level, message) {
  logging.log(level, '', message);
}

/** The `refused` enum of agent.wit: why the host did not do what the agent asked. */
const REFUSALS = new Set(['ended', 'invalid', 'wrong-media', 'over-limit', 'timed-out']);

/**
 * The `refused` case carried by an error that a `session` function threw, or undefined when the error is
 * something else. Both engines throw an Error whose `payload` is the WIT error value (a string here).
 */
function refusal(error) {
  const payload = error?.payload;
  return REFUSALS.has(payload) ? payload : undefined;
}

/**
 * Text calls: speak `text`. `last: false` says more text for the same utterance follows.
 * WIT `option<…>` arguments must be passed explicitly: `null` is none (QuickJS rejects missing ones).
 */
function say(text, { last = null, interruptible = null } = {}) {
  session.say(text, last, interruptible);
}

/** Uses one of Sent's tools with its arguments (a plain object, or none) and returns Sent's answer. */
function tool(name, args = null) {
  return session.tool(name, args === null ? null : JSON.stringify(args));
}

/**
 * Runs one action on the call. Returns false when the call has ended (the caller stops); any other
 * refusal is logged and the caller goes on. An error that is not a refusal is a bug: it propagates.
 */
function step(action) {
  try {
    action();
    return true;
  } catch (error) {
    const reason = refusal(error);
    if (reason === undefined) throw error;
    if (reason === 'ended') return false;
    log('warn', `refused: ${reason}`);
    return true;
  }
}

/**
 * Ends this instance with a trap, like Rust's `panic!`: the host replaces it with a fresh one, which gets
 * `onRestart`. A thrown string would only be the handler's error, and QuickJS also turns a thrown `Error`
 * into one; a thrown value that is neither traps in both engines.
 */
function panic(message) {
  log('error', message);
  throw { panic: message };
}

/** Splits `text` at its first space: [before, after]; after is '' when there is no space. */
function splitOnce(text) {
  const at = text.indexOf(' ');
  return at < 0 ? [text, ''] : [text.slice(0, at), text.slice(at + 1)];
}

// ----- the saved utterance counter -----

/** The saved utterance counter, 0 when nothing (or something unreadable) is saved. */
function savedCount() {
  const bytes = session.load(COUNTER_KEY); // a Uint8Array, or none (undefined or null, by engine)
  const text = bytes == null ? '' : String.fromCharCode(...bytes);
  return /^\d+$/.test(text) ? Number(text) : 0;
}

/** Adds one to the saved utterance counter (decimal ASCII; QuickJS has no TextEncoder). */
function countUtterance() {
  const digits = String(savedCount() + 1);
  session.save(COUNTER_KEY, Uint8Array.from(digits, (digit) => digit.charCodeAt(0)));
}

// ----- the agent -----

/** The commands, by their first word; each gets the rest of the text and returns false if the call ended. */
const COMMANDS = new Map([
  ['echo', (text) => step(() => say(text))],
  [
    'stream',
    (text) => {
      const [word, rest] = splitOnce(text);
      return step(() => say(word, { last: false })) && step(() => say(rest));
    },
  ],
  ['transfer', () => step(() => tool('transfer', { to: { kind: 'user', value: 'conformance-desk' } }))],
  ['hangup', () => step(() => tool('hangup'))],
  ['dtmf', (digits) => step(() => tool('send_dtmf', { digits }))],
  ['hold', () => step(() => tool('hold', { held: true }))],
  ['count', () => step(() => say(`utterances: ${savedCount()}`))],
  ['panic', () => panic('asked to panic')],
]);

/**
 * The exported `handler` interface. Returning normally is `ok`; throwing a string is the handler's `err`
 * (logged and counted by the host, and the call goes on).
 */
export const handler = {
  onSessionStart() {
    if (session.info().media.tag === 'text') {
      step(() => say(GREETING));
    }
  },

  onUserSaid({ text, correction }) {
    if (!step(countUtterance)) return;
    if (correction && !step(() => session.clear())) return;
    const [command, rest] = splitOnce(text);
    COMMANDS.get(command)?.(rest);
  },

  onAudio(samples) {
    // An Int16Array in StarlingMonkey, an Array of numbers in QuickJS: either goes back as it came.
    session.sendAudio(samples);
  },

  onToolResult(answer) {
    // A WIT `result` in a record: { tag: 'ok' } or { tag: 'err', val: tool-error }.
    if (answer.outcome.tag === 'err') {
      step(() => say(`Tool failed: ${answer.outcome.val.code}`));
    }
  },

  onFrame(_frame) {},

  onSessionEnd(_end) {},

  onSessionLost() {},

  onRestart(reason) {
    // A `restart-reason` case: 'panic', 'cpu-deadline', 'memory', …
    log('info', `restarted after: ${reason}`);
  },
};
