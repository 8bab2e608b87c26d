// Qpid Proton C++ (Debian libqpid-proton-cpp12-dev, 0.37) against amqpbroker (issue 21).
// Build: g++ -std=c++17 -O1 driver.cpp -o driver -lqpid-proton-cpp -pthread
// Usage: ./driver < job.json -> one JSON line. job["mode"]: cases | send | recv.
// Proton C++ has no blocking API: each step is a Plan (connections, receivers, one batch
// of sends) run to completion by its own container.
#include <proton/connection.hpp>
#include <proton/connection_options.hpp>
#include <proton/container.hpp>
#include <proton/delivery.hpp>
#include <proton/error_condition.hpp>
#include <proton/message.hpp>
#include <proton/message_id.hpp>
#include <proton/messaging_handler.hpp>
#include <proton/receiver.hpp>
#include <proton/receiver_options.hpp>
#include <proton/sender.hpp>
#include <proton/source_options.hpp>
#include <proton/ssl.hpp>
#include <proton/tracker.hpp>
#include <proton/transport.hpp>
#include <proton/types.hpp>
#include <proton/work_queue.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

using json = nlohmann::json;

static json JOB;
static std::string P;

struct Conn {
    bool tls = false;
    std::string password;
    std::string id;
};

// What to do with each delivery: "accept", "reject", "release", "modify".
using Settle = std::function<std::string(int index)>;

struct Recv {
    std::string source;
    int conn = 0;
    int expect = 0;
    std::string name;
    bool durable = false;
    std::vector<proton::symbol> caps;
    Settle settle = [](int) { return std::string("accept"); };
    std::vector<proton::message> got;
    proton::receiver link;
};

struct Plan {
    std::vector<Conn> conns{Conn{}};
    std::vector<Recv> recvs;
    std::string send_to;
    std::vector<proton::message> to_send;
    int expect_total = -1;  // or: done when this many arrived over all receivers
    bool unsubscribe = true;  // close receiver links (detach closed=true) at the end
    std::string error;
};

static std::string hex(const proton::binary& b) {
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (unsigned char c : b) {
        out += digits[c >> 4];
        out += digits[c & 15];
    }
    return out;
}

static proton::binary unhex(const std::string& s) {
    proton::binary out;
    for (size_t i = 0; i + 1 < s.size(); i += 2) out.push_back(char(std::stoi(s.substr(i, 2), nullptr, 16)));
    return out;
}

class Runner : public proton::messaging_handler {
  public:
    explicit Runner(Plan& plan) : plan_(plan) {}

    void on_container_start(proton::container& c) override {
        for (auto& spec : plan_.conns) {
            proton::connection_options o;
            o.user(JOB["user"].get<std::string>())
                .password(spec.password.empty() ? JOB["password"].get<std::string>() : spec.password)
                .sasl_allowed_mechs("PLAIN")
                .sasl_allow_insecure_mechs(true);
            if (!spec.id.empty()) o.container_id(spec.id);
            std::string url = "amqp://" + JOB["host"].get<std::string>() + ":" + std::to_string(JOB["port"].get<int>());
            if (spec.tls) {
                o.ssl_client_options(proton::ssl_client_options(JOB["ca"].get<std::string>(), proton::ssl::VERIFY_PEER_NAME));
                o.virtual_host(JOB["tls_host"].get<std::string>());
                url = "amqps://" + JOB["tls_host"].get<std::string>() + ":" + std::to_string(JOB["tls_port"].get<int>());
            }
            conns_.push_back(c.connect(url, o));
        }

        for (auto& r : plan_.recvs) {
            proton::receiver_options ro;
            ro.auto_accept(false).credit_window(10);
            if (!r.name.empty()) ro.name(r.name);
            proton::source_options so;
            if (r.durable) so.durability_mode(proton::source::UNSETTLED_STATE).expiry_policy(proton::source::NEVER);
            if (!r.caps.empty()) so.capabilities(r.caps);
            ro.source(so);
            r.link = conns_[r.conn].open_receiver(r.source, ro);
        }
        if (plan_.recvs.empty()) open_sender(conns_[0]);
    }

    // The sender goes on the connection of the event at hand: the proactor only looks at
    // a connection again when something happens on it.
    void on_receiver_open(proton::receiver& r) override {
        if (++opened_ == int(plan_.recvs.size())) {
            open_sender(r.connection());
            check_done();
        }
    }

    void on_sendable(proton::sender& s) override {
        while (sent_ < int(plan_.to_send.size()) && s.credit() > 0) s.send(plan_.to_send[sent_++]);
    }

    void on_tracker_accept(proton::tracker& t) override {
        if (++accepted_ == int(plan_.to_send.size())) t.sender().close();
        check_done();
    }

    void on_tracker_reject(proton::tracker& t) override { fail("send rejected"); }

    void on_message(proton::delivery& d, proton::message& m) override {
        for (auto& r : plan_.recvs) {
            if (r.link != d.receiver()) continue;
            std::string action = r.settle(int(r.got.size()));
            r.got.push_back(m);
            if (action == "accept") d.accept();
            else if (action == "reject") d.reject();
            else if (action == "release") d.release();
            else d.modify();
        }
        check_done();
    }

    void on_transport_error(proton::transport& t) override { fail(t.error().what()); }

    void on_connection_error(proton::connection& c) override { fail(c.error().what()); }
    void on_receiver_error(proton::receiver& r) override { fail(r.error().what()); }
    void on_sender_error(proton::sender& s) override { fail(s.error().what()); }

  private:
    void open_sender(proton::connection c) {
        if (plan_.send_to.empty() || sender_opened_) return;
        sender_opened_ = true;
        c.open_sender(plan_.send_to);
    }

    void check_done() {
        if (accepted_ < int(plan_.to_send.size())) return;
        if (opened_ < int(plan_.recvs.size())) return;
        size_t total = 0;
        for (auto& r : plan_.recvs) {
            total += r.got.size();
            if (int(r.got.size()) < r.expect) return;
        }
        if (plan_.expect_total >= 0 && int(total) < plan_.expect_total) return;
        finish();
    }

    void fail(const std::string& what) {
        if (plan_.error.empty()) plan_.error = what;
        finish();
    }

    // Each connection is closed from its own work queue: the proactor only looks at a
    // connection when something happens on it, so a close made while handling another
    // connection's event would wait for the broker's next frame.
    void finish() {
        if (finished_) return;
        finished_ = true;
        for (auto& c : conns_) {
            std::vector<proton::receiver> links;
            if (plan_.unsubscribe)
                for (auto& r : plan_.recvs)
                    if (r.link.connection() == c) links.push_back(r.link);
            c.work_queue().add([c, links]() mutable {
                for (auto& l : links)
                    if (l.active()) l.close();
                c.close();
            });
        }
    }

    Plan& plan_;
    std::vector<proton::connection> conns_;
    int opened_ = 0, sent_ = 0, accepted_ = 0;
    bool sender_opened_ = false, finished_ = false;
};

// Bounded: a watchdog thread stops the container (stop() is thread-safe) after 20 s.
static void run(Plan& plan) {
    Runner runner(plan);
    proton::container container(runner);
    std::atomic<bool> done{false}, timed_out{false};
    std::thread watchdog([&] {
        for (int i = 0; i < 200 && !done; i++) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (!done) {
            timed_out = true;
            container.stop();
        }
    });
    container.run();
    done = true;
    watchdog.join();
    if (timed_out) throw std::runtime_error("timed out after 20 s");
    if (!plan.error.empty()) throw std::runtime_error(plan.error);
}

static std::vector<proton::message> bodies(const std::string& stem, int n) {
    std::vector<proton::message> out;
    for (int i = 0; i < n; i++) out.emplace_back(stem + std::to_string(i));
    return out;
}

static json body_strings(const Recv& r) {
    json out = json::array();
    for (auto& m : r.got) out.push_back(proton::get<std::string>(m.body()));
    return out;
}

static Plan send_then_receive(const std::string& address, std::vector<proton::message> msgs, int expect) {
    Plan plan;
    plan.send_to = address;
    plan.to_send = std::move(msgs);
    Recv r;
    r.source = address;
    r.expect = expect;
    plan.recvs.push_back(r);
    return plan;
}

static json queue_case() {
    Plan plan = send_then_receive("q." + P + ".order", bodies("m", 5), 5);
    run(plan);
    return body_strings(plan.recvs[0]);
}

static json topic_case() {
    Plan plan = send_then_receive("t." + P + ".news", bodies("n", 3), 3);
    plan.recvs.push_back(plan.recvs[0]);
    run(plan);
    return json::array({body_strings(plan.recvs[0]), body_strings(plan.recvs[1])});
}

static json reject_case() {
    std::string address = "q." + P + ".rej";
    Plan plan = send_then_receive(address, {proton::message("poison")}, 1);
    plan.recvs[0].settle = [](int) { return std::string("reject"); };
    run(plan);
    Plan dead;
    Recv r;
    r.source = "DLA::DLQ." + address;
    r.expect = 1;
    dead.recvs.push_back(r);
    run(dead);
    auto& m = dead.recvs[0].got[0];
    json annotations = json::object();
    for (auto& [k, v] : proton::get<std::map<proton::annotation_key, proton::value>>(m.message_annotations().value()))
        if (v.type() == proton::STRING) annotations[proton::get<proton::symbol>(k)] = proton::get<std::string>(v);
    return {{"body", proton::get<std::string>(m.body())}, {"annotations", annotations}};
}

// modify() is all the C++ API has: it settles with modified and leaves delivery-failed
// unset (0.37 has no setter), so the broker does not count the attempt.
static json redelivery_case(const std::string& address, const std::string& action) {
    Plan plan = send_then_receive(address, {proton::message("again")}, 2);
    plan.recvs[0].settle = [action](int i) { return i == 0 ? action : std::string("accept"); };
    run(plan);
    auto& got = plan.recvs[0].got;
    return json::array({got[0].delivery_count(), got[1].delivery_count()});
}

static json tls_case() {
    Plan plan = send_then_receive("q." + P + ".tls", {proton::message("over-tls")}, 1);
    plan.conns[0].tls = true;
    run(plan);
    bool refused = false;
    Plan wrong = send_then_receive("q." + P + ".tls-wrong", {proton::message("x")}, 1);
    wrong.conns[0].tls = true;
    wrong.conns[0].password = "wrong";
    try {
        run(wrong);
    } catch (const std::exception& e) {
        refused = std::string(e.what()).find("unauthorized") != std::string::npos;
    }
    return {{"body", proton::get<std::string>(plan.recvs[0].got[0].body())}, {"wrong_password_refused", refused}};
}

static json large_case() {
    proton::binary payload;
    int size = JOB["large"].get<int>();
    for (int i = 0; i < size; i++) payload.push_back(char(i % 256));
    proton::message m;
    m.body(payload);
    m.inferred(true);
    Plan plan = send_then_receive("q." + P + ".large", {m}, 1);
    run(plan);
    auto got = proton::get<proton::binary>(plan.recvs[0].got[0].body());
    return {{"size", got.size()}, {"same", got == payload}};
}

static json durable_case() {
    std::string address = "t." + P + ".dur", id = "proton-cpp-durable-" + P;
    Plan attach;  // attach, then close the connection with the link still attached
    attach.conns[0].id = id;
    attach.unsubscribe = false;
    Recv r;
    r.source = address;
    r.name = "sub";
    r.durable = true;
    attach.recvs.push_back(r);
    run(attach);
    Plan send;
    send.send_to = address;
    send.to_send = {proton::message("d0"), proton::message("d1")};
    run(send);
    Plan again;
    again.conns[0].id = id;
    again.recvs.push_back(r);
    again.recvs[0].expect = 2;
    run(again);
    return body_strings(again.recvs[0]);
}

static json shared_case() {
    Plan plan;
    plan.conns = {Conn{}, Conn{}};
    for (int i = 0; i < 2; i++) {
        Recv r;
        r.source = "t." + P + ".shared";
        r.conn = i;
        r.name = "shsub";
        r.durable = true;
        r.caps = {proton::symbol("shared"), proton::symbol("global")};
        plan.recvs.push_back(r);
    }
    plan.send_to = "t." + P + ".shared";
    plan.to_send = bodies("s", 4);
    plan.expect_total = 4;
    run(plan);
    json all = json::array();
    json per = json::array();
    for (auto& r : plan.recvs) {
        per.push_back(r.got.size());
        for (auto& m : r.got) all.push_back(proton::get<std::string>(m.body()));
    }
    std::sort(all.begin(), all.end());
    return {{"bodies", all}, {"per_receiver", per}};
}

// --- cross matrix ----------------------------------------------------------------------

static proton::value native(const json& typed) {
    std::string t = typed["t"];
    const json& v = typed["v"];
    if (t == "string") return v.get<std::string>();
    if (t == "int") return int32_t(v.get<int64_t>());
    if (t == "long") return v.get<int64_t>();
    if (t == "boolean") return v.get<bool>();
    if (t == "double") return v.get<double>();
    if (t == "binary") return unhex(v.get<std::string>());
    if (t == "map") {
        std::map<std::string, proton::value> out;
        for (auto& [k, x] : v.items()) out[k] = native(x);
        return out;
    }
    if (t == "list") {
        std::vector<proton::value> out;
        for (auto& x : v) out.push_back(native(x));
        return out;
    }
    return proton::value();
}

static json plain(const proton::value& v) {
    switch (v.type()) {
        case proton::NULL_TYPE: return nullptr;
        case proton::BOOLEAN: return proton::get<bool>(v);
        case proton::STRING: return proton::get<std::string>(v);
        case proton::SYMBOL: return std::string(proton::get<proton::symbol>(v));
        case proton::BINARY: return {{"hex", hex(proton::get<proton::binary>(v))}};
        case proton::DOUBLE: case proton::FLOAT: return proton::coerce<double>(v);
        case proton::UBYTE: case proton::USHORT: case proton::UINT: case proton::ULONG:
            return proton::coerce<uint64_t>(v);
        case proton::BYTE: case proton::SHORT: case proton::INT: case proton::LONG:
            return proton::coerce<int64_t>(v);
        case proton::MAP: {
            json out = json::object();
            for (auto& [k, x] : proton::get<std::map<std::string, proton::value>>(v)) out[k] = plain(x);
            return out;
        }
        case proton::LIST: {
            json out = json::array();
            for (auto& x : proton::get<std::vector<proton::value>>(v)) out.push_back(plain(x));
            return out;
        }
        default: return proton::to_string(v);
    }
}

static std::string hex_of(const std::vector<char>& bytes) {
    return hex(proton::binary(bytes.begin(), bytes.end()));
}

// Sends the matrix messages; reports each one as encoded, for the bare-message check.
static json matrix_send() {
    json sent = json::object();
    for (auto& target : JOB["targets"]) {
        Plan plan;
        plan.send_to = target.get<std::string>();
        for (auto& spec : JOB["messages"]) {
            proton::message m;
            m.id(spec["id"].get<std::string>());
            m.content_type(spec["content_type"].get<std::string>());
            for (auto& [k, x] : spec["props"].items()) m.properties().put(k, proton::get<proton::scalar>(native(x)));
            m.body(native(spec["body"]["value"]));
            m.inferred(spec["body"]["kind"] == "data");
            std::vector<char> encoded;
            m.encode(encoded);
            sent[plan.send_to].push_back(hex_of(encoded));
            plan.to_send.push_back(m);
        }
        run(plan);
    }
    return {{"sent", sent}};
}

static json matrix_recv() {
    json out = json::object();
    for (auto& source : JOB["sources"]) {
        Plan plan;
        Recv r;
        r.source = source.get<std::string>();
        r.expect = JOB["count"].get<int>();
        plan.recvs.push_back(r);
        run(plan);
        json list = json::array();
        for (auto& m : plan.recvs[0].got) {
            json props = json::object();
            for (auto& [k, x] : proton::get<std::map<std::string, proton::scalar>>(m.properties().value()))
                props[k] = plain(proton::value(x));
            bool data = m.inferred() && m.body().type() == proton::BINARY;
            list.push_back({{"id", proton::get<std::string>(m.id())},
                            {"content_type", m.content_type()},
                            {"props", props},
                            {"body", {{"kind", data ? "data" : "value"}, {"value", plain(m.body())}}}});
        }
        out[r.source] = list;
    }
    return {{"received", out}};
}

int main() {
    JOB = json::parse(std::cin);
    P = JOB["prefix"].get<std::string>();
    json result = json::object();
    std::string mode = JOB["mode"];
    if (mode == "send") {
        result = matrix_send();
    } else if (mode == "recv") {
        result = matrix_recv();
    } else {
        std::vector<std::pair<std::string, std::function<json()>>> cases = {
            {"queue", queue_case},
            {"topic", topic_case},
            {"reject", reject_case},
            {"modified", [] { return redelivery_case("q." + P + ".mod", "modify"); }},
            {"released", [] { return redelivery_case("q." + P + ".rel", "release"); }},
            {"tls", tls_case},
            {"large", large_case},
            {"durable", durable_case},
            {"shared", shared_case},
        };
        for (auto& [name, fn] : cases) {
            try {
                result[name] = fn();
            } catch (const std::exception& e) {
                result[name] = {{"error", e.what()}};
            }
        }
    }
    std::cout << result.dump() << std::endl;
    return 0;
}
