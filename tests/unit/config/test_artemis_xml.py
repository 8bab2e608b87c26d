"""An Artemis broker.xml goes through the same schema as the YAML file (CONTRACT.md)."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from amqpbroker.config import ConfigError, load_config, parse_artemis_xml, parse_config

HEAD = (
    '<configuration xmlns="urn:activemq" '
    'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
    'xsi:schemaLocation="urn:activemq /schema/artemis-configuration.xsd">\n'
    '<core xmlns="urn:activemq:core">\n'
)
TAIL = "</core>\n</configuration>\n"

XML = (
    HEAD
    + textwrap.dedent("""\
    <name>broker-1</name>
    <persistence-enabled>true</persistence-enabled>
    <journal-datasync>false</journal-datasync>
    <max-redelivery-records>1</max-redelivery-records>
    <message-expiry-scan-period>1000</message-expiry-scan-period>
    <wildcard-addresses><routing-enabled>true</routing-enabled></wildcard-addresses>
    <acceptors>
       <acceptor name="amqp">tcp://127.0.0.1:0?protocols=AMQP;anycastPrefix=anycast://;amqpDuplicateDetection=false</acceptor>
    </acceptors>
    <security-settings>
       <security-setting match="#">
          <permission type="createNonDurableQueue" roles="amq, app"/>
          <permission type="send" roles="amq"/>
       </security-setting>
    </security-settings>
    <address-settings>
       <!--default for catch all-->
       <address-setting match="#">
          <dead-letter-address>DLQ</dead-letter-address>
          <expiry-address>ExpiryQueue</expiry-address>
          <redelivery-delay>0</redelivery-delay>
          <redelivery-delay-multiplier>2</redelivery-delay-multiplier>
          <page-size-bytes>10M</page-size-bytes>
          <max-size-bytes>-1</max-size-bytes>
          <address-full-policy>PAGE</address-full-policy>
          <default-queue-routing-type>ANYCAST</default-queue-routing-type>
          <dead-letter-queue-suffix></dead-letter-queue-suffix>
       </address-setting>
    </address-settings>
    <addresses>
       <address name="DLQ">
          <anycast><queue name="DLQ" max-consumers="2"><durable>false</durable></queue></anycast>
       </address>
       <address name="news">
          <multicast><queue name="audit"><filter string="priority &gt; 4"/></queue></multicast>
       </address>
    </addresses>
    """)
    + TAIL
)

SAME_AS_YAML = textwrap.dedent("""\
    name: broker-1
    persistence: {enabled: true, sync: false}
    max-redelivery-records: 1
    message-expiry-scan-period: 1000
    wildcard-addresses: {enabled: true}
    acceptors:
      - {name: amqp, url: "amqp://127.0.0.1:0", anycast-prefix: "anycast://",
         amqp-duplicate-detection: false}
    security:
      security-settings:
        "#": {create-non-durable-queue: [amq, app], send: [amq]}
    address-settings:
      "#":
        dead-letter-address: DLQ
        expiry-address: ExpiryQueue
        redelivery-delay: 0
        redelivery-delay-multiplier: 2.0
        page-size-bytes: 10485760
        max-size-bytes: -1
        address-full-policy: PAGE
        default-queue-routing-type: ANYCAST
        dead-letter-queue-suffix: ""
    addresses:
      - name: DLQ
        anycast: [{name: DLQ, max-consumers: 2, durable: false}]
      - name: news
        multicast: [{name: audit, filter: "priority > 4"}]
    """)


def xml_problems(body: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_artemis_xml(HEAD + textwrap.dedent(body) + TAIL, source="b.xml")
    return [str(p) for p in info.value.problems]


def test_broker_xml_reads_as_the_same_yaml() -> None:
    """Same keys, same values: the XML and its YAML twin build equal configs."""
    from_xml = parse_artemis_xml(XML, source="x")
    from_yaml = parse_config(SAME_AS_YAML, source="x")
    assert from_xml == from_yaml
    assert dataclasses.replace(from_xml.acceptors[0]).url == "amqp://127.0.0.1:0"


def test_load_config_reads_xml_files(tmp_path: Path) -> None:
    path = tmp_path / "broker.xml"
    path.write_text(XML)
    assert load_config(path).name == "broker-1"


def test_tls_acceptor_from_pem_stores() -> None:
    body = """\
        <acceptors>
          <acceptor name="amqps">tcp://0.0.0.0:5671?sslEnabled=true;keyStorePath=s.pem;keyStoreType=PEM;trustStorePath=ca.pem;trustStoreType=PEM;needClientAuth=true</acceptor>
          <acceptor name="default-port">tcp://0.0.0.0</acceptor>
        </acceptors>
        """
    config = parse_artemis_xml(HEAD + textwrap.dedent(body) + TAIL)
    secure, default = config.acceptors
    assert (secure.scheme, secure.host, secure.port) == ("amqps", "0.0.0.0", 5671)
    assert secure.tls is not None
    assert (secure.tls.cert_file, secure.tls.key_file, secure.tls.ca_file) == (
        "s.pem",
        "s.pem",
        "ca.pem",
    )
    assert secure.tls.client_auth == "required"
    assert default.port == 61616  # the Artemis default


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "<journal-type>NIO</journal-type>\n",
            ["b.xml:3: core.journal-type: <journal-type> is not supported by amqpbroker"],
        ),
        (
            "<persistance-enabled>true</persistance-enabled>\n",
            [
                "b.xml:3: core.persistance-enabled: <persistance-enabled> is not supported by "
                "amqpbroker (did you mean 'persistence-enabled'?)"
            ],
        ),
        (
            '<address-settings>\n  <address-setting match="#">\n'
            "    <message-counter-history-day-limit>10</message-counter-history-day-limit>\n"
            "    <max-delivery-attempts>ten</max-delivery-attempts>\n"
            "  </address-setting>\n</address-settings>\n",
            [
                'b.xml:5: address-settings."#".message-counter-history-day-limit: '
                "<message-counter-history-day-limit> is not supported by amqpbroker",
                "b.xml:6: address-settings.\"#\".max-delivery-attempts: not an integer: 'ten'",
            ],
        ),
        (
            '<security-settings><security-setting match="a..b"/></security-settings>\n',
            [
                "b.xml:3: security.security-settings.\"a..b\": an empty word (two '.' together): "
                "did you mean 'a.b'?"
            ],
        ),
        (
            '<address-settings><address-setting match="a.#.b"/></address-settings>\n',
            [
                "b.xml:3: address-settings.\"a.#.b\": '#' is allowed only as the last word of "
                "a pattern"
            ],
        ),
        (
            "<acceptors>\n"
            '  <acceptor name="artemis">tcp://0.0.0.0:61616?protocols=CORE,AMQP;useEpoll=true'
            "</acceptor>\n"
            '  <acceptor name="stomp">tcp://0.0.0.0:61613?protocols=STOMP</acceptor>\n'
            '  <acceptor name="ssl">tcp://0.0.0.0:5671?sslEnabled=true;keyStorePath=k.jks'
            "</acceptor>\n"
            "</acceptors>\n",
            [
                "b.xml:4: acceptors[0].url: only AMQP is served; not supported: CORE",
                "b.xml:4: acceptors[0].url: acceptor parameter 'useEpoll' is not supported by "
                "amqpbroker",
                "b.xml:5: acceptors[1].url: serves no AMQP (protocols=STOMP)",
                "b.xml:6: acceptors[2].tls: keyStoreType=JKS: only PEM stores are read",
            ],
        ),
        (
            '<addresses>\n  <address name="a">\n'
            '    <anycast><queue name="q" enabled="false"><user>x</user></queue></anycast>\n'
            '  </address>\n  <address name="b"><multicast><queue name="q"/></multicast></address>\n'
            "</addresses>\n",
            [
                "b.xml:5: addresses[0].anycast[0]: attribute 'enabled' of <queue> is not "
                "supported by amqpbroker",
                "b.xml:5: addresses[0].anycast[0].user: <user> is not supported by amqpbroker",
                "b.xml:7: addresses[1].multicast[0].name: queue name 'q' is used more than once "
                "(also at line 5); queue names are unique across the broker",
            ],
        ),
        (
            "<security-enabled>true</security-enabled>\n",
            [
                "b.xml:3: security.enabled: users are not read from broker.xml (Artemis keeps "
                "them in JAAS login modules): write this config as YAML (security.users) to "
                "enable security"
            ],
        ),
        (
            "<name>${name}</name>\n",
            ["b.xml:3: name: ${...} substitution is not supported: '${name}'"],
        ),
        (
            "<name>a</name>\n<name>b</name>\n",
            ["b.xml:4: name: <name> is given more than once"],
        ),
    ],
)
def test_what_amqpbroker_does_not_do_is_reported(body: str, expected: list[str]) -> None:
    """CONTRACT: what broker.xml holds that the broker does not support is reported."""
    assert xml_problems(body) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<configuration><core>\n<name>x</core>", "b.xml:2: (xml): not valid XML: mismatched tag"),
        ("<broker/>", "b.xml:1: (xml): expected <configuration> as the root, not <broker>"),
        (
            '<!DOCTYPE x [<!ENTITY a "b">]>\n<configuration/>',
            "b.xml:1: (xml): a DOCTYPE is not supported in broker.xml",
        ),
        ("<configuration/>", "b.xml:1: core: expected exactly one <core> element"),
    ],
)
def test_the_xml_itself(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_artemis_xml(text, source="b.xml")
    assert [str(p) for p in info.value.problems] == [expected]


def test_connection_limit_parameters_of_an_acceptor() -> None:
    """Issue 15 item 8: Artemis handshake-timeout, amqpIdleTimeout, connectionsAllowed."""
    body = """\
        <acceptors>
          <acceptor name="a">tcp://0.0.0.0:5672?handshake-timeout=5;amqpIdleTimeout=0;connectionsAllowed=100</acceptor>
        </acceptors>
        """
    (acceptor,) = parse_artemis_xml(HEAD + textwrap.dedent(body) + TAIL).acceptors
    assert (acceptor.handshake_timeout, acceptor.amqp_idle_timeout) == (5, 0)
    assert acceptor.connections_allowed == 100


@pytest.mark.timeout(10)
def test_a_long_text_of_many_lines_is_read_in_linear_time() -> None:
    """Issue 15 attack (B-160): expat hands text over a line at a time and each piece was
    added to the whole (`text += piece`): 800 KB of lines took 19 s, 8 MB half an hour.
    Pieces are joined once."""
    text = "<configuration><core><name>" + "a\n" * 1_000_000 + "b</name></core></configuration>"
    config = parse_artemis_xml(text, source="b.xml")
    assert config.name == "a\n" * 1_000_000 + "b"


def test_a_number_past_pythons_digit_limit_is_a_problem_not_a_traceback(tmp_path: Path) -> None:
    """Eighth attack pass: broker.xml's tree skipped the YAML tag check, so
    `<global-max-size>` of 5,000 digits raised ValueError out of `int()` (a traceback
    from `check-config`)."""
    big = "1" * 5000
    path = tmp_path / "broker.xml"
    path.write_text(
        '<configuration xmlns="urn:activemq"><core xmlns="urn:activemq:core">'
        f"<global-max-size>{big}</global-max-size><max-disk-usage>{big}</max-disk-usage>"
        "</core></configuration>"
    )
    with pytest.raises(ConfigError, match=r"is not a valid 'tag:yaml\.org,2002:int' value"):
        load_config(path)
