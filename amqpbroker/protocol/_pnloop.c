/* The hot path's calls into the Proton engine, fused (issue 20): what `transfers.py` and
   `shell.py` did with several cffi calls per message (each converting its arguments and
   releasing and retaking the GIL, ~1k instructions) in one. setup.py builds this with
   cffi (`_pnloop.h` is its cdef) and removes the GIL release of these calls: each does a
   few engine calls on memory of the loop thread's own connection, nothing that blocks.
   Proton's functions are called through pointers that `protocol/pnloop.py` takes from
   python-qpid-proton's own binding (`amqpb_bind`), so nothing is linked against it. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

typedef struct { size_t size; const char *start; } amqpb_bytes;

/* PN_DELIVERY, PN_LINK_FLOW, PN_ACCEPTED, PN_MODIFIED: pnloop.py checks them against
   proton's. */
enum { AMQPB_DELIVERY = 28, AMQPB_LINK_FLOW = 26, AMQPB_ACCEPTED = 36, AMQPB_MODIFIED = 39 };

static void *(*collector_peek)(void *);
static bool (*collector_pop)(void *);
static void *(*event_delivery)(void *);
static int (*event_type)(void *);
static void *(*event_link)(void *);
static void *(*delivery_link)(void *);
static size_t (*delivery_pending)(void *);
static bool (*delivery_partial)(void *);
static uint64_t (*delivery_remote_state)(void *);
static ssize_t (*link_recv)(void *, char *, size_t);
static bool (*link_advance)(void *);
static void (*delivery_update)(void *, uint64_t);
static void (*delivery_settle)(void *);
static void *(*delivery_new)(void *, amqpb_bytes);
static ssize_t (*link_send)(void *, const char *, size_t);
static int (*link_credit)(void *);
static bool (*link_get_drain)(void *);
static int (*object_decref)(void *);
static void *(*delivery_remote)(void *);
static bool (*disposition_is_failed)(void *);
static bool (*disposition_is_undeliverable)(void *);

/* The order of pnloop.py's FUNCTIONS. */
static void **const SLOTS[] = {
    (void **)&collector_peek, (void **)&collector_pop, (void **)&event_delivery,
    (void **)&event_type, (void **)&event_link, (void **)&delivery_link,
    (void **)&delivery_pending, (void **)&delivery_partial, (void **)&delivery_remote_state,
    (void **)&link_recv, (void **)&link_advance, (void **)&delivery_update,
    (void **)&delivery_settle, (void **)&delivery_new, (void **)&link_send,
    (void **)&link_credit, (void **)&link_get_drain, (void **)&object_decref,
    (void **)&delivery_remote, (void **)&disposition_is_failed,
    (void **)&disposition_is_undeliverable,
};

int amqpb_bind(void **functions, int count) {
    int n = (int)(sizeof(SLOTS) / sizeof(SLOTS[0]));
    if (count != n) return -1;
    for (int i = 0; i < n; i++) {
        if (functions[i] == NULL) return -1;
        *SLOTS[i] = functions[i];
    }
    return n;
}

/* The collector's next event (the previous one popped first if `pop_previous`), its
   numbers packed into the result, 0 for none (issue 20: each read of a cdata array from
   Python cost ~290 instructions, four a message). `amqpb_pointers`: [0] the event, [1] its
   delivery (NULL unless PN_DELIVERY), [2] the delivery's link, else the event's (NULL if
   none). The result: bits 0-7 the event type (`AMQPB_TYPE_BITS`); of a delivery, bit 8
   whether it is partial, bits 9-16 its remote state (`AMQPB_STATE_FAR` for one of 255 or
   more: then `amqpb_numbers[0]` holds it), bits 17-18 of a modified state 2 x delivery-failed +
   undeliverable-here, bits 19- its pending bytes; of PN_LINK_FLOW, bit 8 whether the
   link drains, bits 9- its credit (signed: the result is credit x 512 + ...). */
enum { AMQPB_TYPE_BITS = 8, AMQPB_STATE_FAR = 255 };

/* The loop thread's out-arrays of `amqpb_next`, one pair for every connection's loop: each
   reads them right after its call, before anything that could run another loop (two cffi
   argument conversions an event fewer than arrays passed in, issue 20). */
void *amqpb_pointers[3];
int64_t amqpb_numbers[1];

int64_t amqpb_next(void *collector, int pop_previous) {
    void **pointers = amqpb_pointers;
    int64_t *numbers = amqpb_numbers;
    if (pop_previous) collector_pop(collector);
    void *event = collector_peek(collector);
    if (event == NULL) return 0;
    pointers[0] = event;
    void *delivery = event_delivery(event);
    pointers[1] = delivery;
    if (delivery != NULL) {
        pointers[2] = delivery_link(delivery);
        uint64_t state = delivery_remote_state(delivery);
        int64_t packed = AMQPB_DELIVERY;
        if (delivery_partial(delivery)) packed |= 1 << 8;
        if (state >= AMQPB_STATE_FAR) {
            numbers[0] = (int64_t)state;
            state = AMQPB_STATE_FAR;
        }
        packed |= (int64_t)state << 9;
        if (state == AMQPB_MODIFIED) {
            void *remote = delivery_remote(delivery);
            packed |= (int64_t)((disposition_is_failed(remote) ? 2 : 0) +
                                (disposition_is_undeliverable(remote) ? 1 : 0))
                      << 17;
        }
        return packed | (int64_t)delivery_pending(delivery) << 19;
    }
    void *link = event_link(event);
    pointers[2] = link;
    int type = event_type(event);
    if (type == AMQPB_LINK_FLOW && link != NULL) {
        return (int64_t)link_credit(link) * 512 + (link_get_drain(link) ? 256 : 0) + type;
    }
    return type;
}

/* The link's current (complete) delivery read into `buffer`, then the link advanced: the
   bytes received, or proton's negative code (PN_ABORTED, PN_EOS). */
int64_t amqpb_recv(void *link, char *buffer, size_t size) {
    ssize_t received = link_recv(link, buffer, size);
    link_advance(link);
    return (int64_t)received;
}

void amqpb_accept(void *delivery) {
    delivery_update(delivery, AMQPB_ACCEPTED);
    delivery_settle(delivery);
}

void amqpb_settle(void *delivery) { delivery_settle(delivery); }

/* A durable send stored: accepted, settled, and the reference the loop kept let go. */
void amqpb_accept_stored(void *delivery) {
    delivery_update(delivery, AMQPB_ACCEPTED);
    delivery_settle(delivery);
    object_decref(delivery);
}

/* `id` in decimal at the end of `end`'s buffer (20 bytes before it hold any uint64): where
   it starts. snprintf cost ~700 instructions a send (callgrind, issue 20). */
static char *decimal(char *end, uint64_t id) {
    char *start = end;
    do {
        *--start = (char)('0' + id % 10);
        id /= 10;
    } while (id != 0);
    return start;
}

/* A transfer of `data` on `link` tagged with `id` in decimal (`shell.delivery_id_of` reads
   it back), settled at once if `settle`: the new delivery. */
void *amqpb_send(void *link, uint64_t id, const char *data, size_t size, int settle) {
    char tag[24];
    char *start = decimal(tag + sizeof(tag), id);
    amqpb_bytes bytes = {(size_t)(tag + sizeof(tag) - start), start};
    void *delivery = delivery_new(link, bytes);
    link_send(link, data, size);
    link_advance(link);
    if (settle) delivery_settle(delivery);
    return delivery;
}
