/* The cdef of `_pnloop` (setup.py builds it with cffi; `protocol/pnloop.py` loads it).
   Pointers are `void *`: cffi hands them to proton's own functions as they are, and they
   hash and compare equal to proton's typed pointers (dict keys of the hot path). */
int amqpb_bind(void **functions, int count);
extern void *amqpb_pointers[3];
extern int64_t amqpb_numbers[1];
int64_t amqpb_next(void *collector, int pop_previous);
int64_t amqpb_recv(void *link, char *buffer, size_t size);
void amqpb_accept(void *delivery);
void amqpb_settle(void *delivery);
void amqpb_accept_stored(void *delivery);
void *amqpb_send(void *link, uint64_t id, const char *data, size_t size, int settle);
