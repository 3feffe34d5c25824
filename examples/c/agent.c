/*
 * The conformance agent of the Sent Voice Agents protocol (protocol.md §9.2) in C, for voicehost: the
 * same behaviour as the Rust example in examples/conformance, including its three extras (the saved
 * utterance counter, "count" and "panic").
 *
 * | trigger                              | action                                                            |
 * |--------------------------------------|-------------------------------------------------------------------|
 * | session start of a text call         | say "Hello from the conformance agent."                           |
 * | user-said with `correction`          | clear() first (stop if the call has ended), then the command below |
 * | "echo <text>"                        | say <text>                                                        |
 * | "stream <word> <rest>"               | say <word> with last = false, then say <rest>                     |
 * | "transfer"                           | tool transfer {"to":{"kind":"user","value":"conformance-desk"}}   |
 * | "hangup"                             | tool hangup, no arguments                                         |
 * | "dtmf <digits>"                      | tool send_dtmf {"digits":"<digits>"}                              |
 * | "hold"                               | tool hold {"held":true}                                           |
 * | "count"                              | say "utterances: N" (the saved counter, see below)                |
 * | "panic"                              | abort(): the instance traps                                       |
 * | any other text                       | nothing                                                           |
 * | tool result, ok false, with an error | say "Tool failed: <error.code>"                                   |
 * | audio                                | send the same samples back (echo)                                 |
 *
 * The command is the text up to the first space. If an action is refused with `ended`, the agent stops
 * processing the utterance; other refusals are logged and the next action goes on.
 *
 * Every user-said first adds one to a counter saved with save("utterances", ...) as decimal ASCII (before
 * its command runs, so "panic" and "count" count too); "count" reads it back with load(). Saved state
 * survives a restart, so "echo a", "panic", "count" says "utterances: 3" from the fresh instance.
 *
 * Ownership (wit-bindgen C): every exported function owns its parameters and frees them; what an import
 * returns belongs to the caller, who frees it; what the agent passes to an import stays the agent's (the
 * import only borrows it), so string literals and slices of other strings can be passed as they are.
 */

#include "agent.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef voicehost_agent_types_refused_t refused_t;

/* What the conformance agent says first in a text call. */
static const char GREETING[] = "Hello from the conformance agent.";

/* The key of the saved utterance counter. */
static const char COUNTER_KEY[] = "utterances";

/* ---- strings ---------------------------------------------------------------------------------------- */

/* A WIT string that borrows the NUL-terminated `text` (nothing to free). */
static agent_string_t borrowed(const char *text) {
    return (agent_string_t){.ptr = (uint8_t *)text, .len = strlen(text)};
}

/* Whether `s` is exactly the NUL-terminated `literal`. */
static bool equals(agent_string_t s, const char *literal) {
    size_t len = strlen(literal);
    return s.len == len && memcmp(s.ptr, literal, len) == 0;
}

/* Splits `s` at its first space: `*head` is what comes before it, `*tail` what comes after it (empty
 * without a space). Both borrow from `s`. */
static void split_once(agent_string_t s, agent_string_t *head, agent_string_t *tail) {
    uint8_t *space = memchr(s.ptr, ' ', s.len);
    if (space == NULL) {
        *head = s;
        *tail = (agent_string_t){.ptr = s.ptr + s.len, .len = 0};
    } else {
        *head = (agent_string_t){.ptr = s.ptr, .len = (size_t)(space - s.ptr)};
        *tail = (agent_string_t){.ptr = space + 1, .len = s.len - head->len - 1};
    }
}

/* Writes `value` in decimal at the end of `buf[0..size)` and returns where it starts. */
static char *format_u64(uint64_t value, char *buf, size_t size) {
    char *p = buf + size;
    *--p = '\0';
    do {
        *--p = (char)('0' + value % 10);
        value /= 10;
    } while (value != 0);
    return p;
}

/* A new heap string: `prefix` followed by `s`. Free it with agent_string_free. */
static agent_string_t concat(const char *prefix, agent_string_t s) {
    size_t len = strlen(prefix);
    agent_string_t out = {.ptr = malloc(len + s.len), .len = len + s.len};
    if (out.ptr == NULL) abort();
    memcpy(out.ptr, prefix, len);
    memcpy(out.ptr + len, s.ptr, s.len);
    return out;
}

/* ---- host calls ------------------------------------------------------------------------------------- */

/* Logs through wasi:logging, with no context. */
static void log_message(wasi_logging_logging_level_t level, agent_string_t message) {
    agent_string_t context = borrowed("");
    wasi_logging_logging_log(level, &context, &message);
}

static const char *refused_name(refused_t refused) {
    switch (refused) {
    case VOICEHOST_AGENT_TYPES_REFUSED_ENDED: return "refused: ended";
    case VOICEHOST_AGENT_TYPES_REFUSED_INVALID: return "refused: invalid";
    case VOICEHOST_AGENT_TYPES_REFUSED_WRONG_MEDIA: return "refused: wrong-media";
    case VOICEHOST_AGENT_TYPES_REFUSED_OVER_LIMIT: return "refused: over-limit";
    case VOICEHOST_AGENT_TYPES_REFUSED_TIMED_OUT: return "refused: timed-out";
    }
    return "refused";
}

/* One action's outcome: false when the utterance must stop (the call has ended). Other refusals are
 * logged and the utterance goes on. */
static bool go_on(bool ok, refused_t refused) {
    if (ok) return true;
    if (refused == VOICEHOST_AGENT_TYPES_REFUSED_ENDED) return false;
    log_message(WASI_LOGGING_LOGGING_LEVEL_WARN, borrowed(refused_name(refused)));
    return true;
}

/* say(text, last): `last` NULL leaves the host's default (true). */
static bool say(agent_string_t text, bool *last) {
    refused_t refused;
    bool ok = voicehost_agent_session_say(&text, last, NULL, &refused);
    return go_on(ok, refused);
}

static bool clear(void) {
    refused_t refused;
    bool ok = voicehost_agent_session_clear(&refused);
    return go_on(ok, refused);
}

/* Uses tool `name` with `arguments` (a JSON object, or NULL for none) and waits for Sent's answer. The
 * answer also reaches on-tool-result, which reports a failure, so here it is only freed. */
static bool tool(const char *name, const char *arguments) {
    agent_string_t name_string = borrowed(name);
    agent_string_t arguments_string;
    if (arguments != NULL) arguments_string = borrowed(arguments);
    voicehost_agent_session_tool_result_t answer;
    refused_t refused;
    bool ok = voicehost_agent_session_tool(&name_string, arguments ? &arguments_string : NULL, &answer,
                                           &refused);
    if (ok) voicehost_agent_session_tool_result_free(&answer);
    return go_on(ok, refused);
}

/* ---- the saved utterance counter -------------------------------------------------------------------- */

/* The saved utterance counter, 0 when nothing (or something unreadable) is saved. */
static uint64_t saved_count(void) {
    agent_string_t key = borrowed(COUNTER_KEY);
    agent_list_u8_t value;
    if (!voicehost_agent_session_load(&key, &value)) return 0;
    uint64_t count = 0;
    bool valid = value.len > 0;
    for (size_t i = 0; valid && i < value.len; i++) {
        unsigned digit = (unsigned)value.ptr[i] - '0';
        valid = digit <= 9 && count <= (UINT64_MAX - digit) / 10;
        count = count * 10 + digit;
    }
    agent_list_u8_free(&value);
    return valid ? count : 0;
}

/* Adds one to the saved utterance counter. */
static bool count_utterance(void) {
    char buf[24];
    char *digits = format_u64(saved_count() + 1, buf, sizeof buf);
    agent_string_t key = borrowed(COUNTER_KEY);
    agent_list_u8_t value = {.ptr = (uint8_t *)digits, .len = strlen(digits)};
    refused_t refused;
    bool ok = voicehost_agent_session_save(&key, &value, &refused);
    return go_on(ok, refused);
}

/* ---- commands --------------------------------------------------------------------------------------- */

/* `{"digits":"<digits>"}` as a new NUL-terminated string, with `digits` escaped for JSON. */
static char *dtmf_arguments(agent_string_t digits) {
    static const char head[] = "{\"digits\":\"", tail[] = "\"}", hex[] = "0123456789abcdef";
    char *json = malloc(sizeof head + 6 * digits.len + sizeof tail);
    if (json == NULL) abort();
    char *p = json;
    memcpy(p, head, sizeof head - 1);
    p += sizeof head - 1;
    for (size_t i = 0; i < digits.len; i++) {
        uint8_t c = digits.ptr[i];
        if (c == '"' || c == '\\') {
            *p++ = '\\';
            *p++ = (char)c;
        } else if (c < 0x20) {
            memcpy(p, "\\u00", 4);
            p[4] = hex[c >> 4];
            p[5] = hex[c & 15];
            p += 6;
        } else {
            *p++ = (char)c;
        }
    }
    memcpy(p, tail, sizeof tail); /* with the NUL */
    return json;
}

/* Runs the command in `text`; false when the utterance had to stop (the call has ended). */
static bool run_command(agent_string_t text) {
    agent_string_t command, rest;
    split_once(text, &command, &rest);

    if (equals(command, "echo")) return say(rest, NULL);
    if (equals(command, "stream")) {
        agent_string_t word, remainder;
        split_once(rest, &word, &remainder);
        bool last = false;
        return say(word, &last) && say(remainder, NULL);
    }
    if (equals(command, "transfer"))
        return tool("transfer", "{\"to\":{\"kind\":\"user\",\"value\":\"conformance-desk\"}}");
    if (equals(command, "hangup")) return tool("hangup", NULL);
    if (equals(command, "dtmf")) {
        char *arguments = dtmf_arguments(rest);
        bool result = tool("send_dtmf", arguments);
        free(arguments);
        return result;
    }
    if (equals(command, "hold")) return tool("hold", "{\"held\":true}");
    if (equals(command, "count")) {
        char buf[24];
        agent_string_t count = borrowed(format_u64(saved_count(), buf, sizeof buf));
        agent_string_t message = concat("utterances: ", count);
        bool result = say(message, NULL);
        agent_string_free(&message);
        return result;
    }
    if (equals(command, "panic")) {
        log_message(WASI_LOGGING_LOGGING_LEVEL_ERROR, borrowed("asked to panic"));
        abort(); /* a trap: the host replaces the instance */
    }
    return true; /* any other text: nothing */
}

/* ---- the handler interface -------------------------------------------------------------------------- */
/* Each export owns its parameters (it frees them) and returns true for ok. On false, `*err` must hold a
 * heap string (agent_string_dup), which the bindings free after the host has read it; no handler of this
 * agent fails. */

bool exports_voicehost_agent_handler_on_session_start(agent_string_t *err) {
    (void)err;
    voicehost_agent_session_call_info_t call;
    voicehost_agent_session_info(&call);
    if (call.media.tag == VOICEHOST_AGENT_TYPES_MEDIA_TEXT) say(borrowed(GREETING), NULL);
    voicehost_agent_session_call_info_free(&call);
    return true;
}

bool exports_voicehost_agent_handler_on_user_said(exports_voicehost_agent_handler_user_said_t *said,
                                                   agent_string_t *err) {
    (void)err;
    /* Each step runs only if the one before did not find the call ended. */
    if (count_utterance() && (!said->correction || clear())) run_command(said->text);
    exports_voicehost_agent_handler_user_said_free(said);
    return true;
}

bool exports_voicehost_agent_handler_on_audio(agent_list_s16_t *samples, agent_string_t *err) {
    (void)err;
    voicehost_agent_session_send_audio(samples); /* borrowed by the import */
    agent_list_s16_free(samples);
    return true;
}

bool exports_voicehost_agent_handler_on_tool_result(exports_voicehost_agent_handler_tool_result_t *answer,
                                                     agent_string_t *err) {
    (void)err;
    if (answer->outcome.is_err) {
        agent_string_t message = concat("Tool failed: ", answer->outcome.val.err.code);
        say(message, NULL);
        agent_string_free(&message);
    }
    exports_voicehost_agent_handler_tool_result_free(answer);
    return true;
}

bool exports_voicehost_agent_handler_on_frame(exports_voicehost_agent_handler_unknown_frame_t *frame,
                                              agent_string_t *err) {
    (void)err;
    exports_voicehost_agent_handler_unknown_frame_free(frame);
    return true;
}

bool exports_voicehost_agent_handler_on_session_end(exports_voicehost_agent_handler_session_end_t *end,
                                                    agent_string_t *err) {
    (void)err;
    exports_voicehost_agent_handler_session_end_free(end);
    return true;
}

bool exports_voicehost_agent_handler_on_session_lost(agent_string_t *err) {
    (void)err;
    return true;
}

bool exports_voicehost_agent_handler_on_restart(exports_voicehost_agent_handler_restart_reason_t reason,
                                                agent_string_t *err) {
    (void)err;
    static const char *const names[] = {"panic", "cpu-deadline", "wall-deadline", "memory", "host-memory",
                                         "stack-overflow", "host-resources", "other", "forced", "moved"};
    const char *name = reason < sizeof names / sizeof names[0] ? names[reason] : "unknown";
    agent_string_t message = concat("restarted after: ", borrowed(name));
    log_message(WASI_LOGGING_LOGGING_LEVEL_INFO, message);
    agent_string_free(&message);
    return true;
}
